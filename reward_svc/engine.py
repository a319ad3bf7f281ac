"""The reward engine: routes each item to its task's scorer and runs scorers in a pool of
worker processes (never on the gRPC event loop), with a per-item time limit."""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from reward_svc.config import RewardSettings
from reward_svc.envs import exact, math
from reward_svc.types import RewardInfo, ScoreItem, ScoreResult

_SCORERS = {"exact": exact.score, "math": math.score}
_ZERO = ScoreResult(reward=0.0, correct=False)


def _score_one(scorer: str, completion: str, ground_truth: str) -> ScoreResult:
    return _SCORERS[scorer](completion, ground_truth)


class RewardEngine:
    """Scores batches for the tasks named in its settings."""

    def __init__(self, settings: RewardSettings, log):
        self._settings = settings
        self._log = log
        self._pool = ProcessPoolExecutor(settings.num_workers, mp_context=multiprocessing.get_context("spawn"))

    async def warm_up(self) -> None:
        """Start the workers and import the scorers before the service reports SERVING."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, _score_one, "exact", "1", "1")
                               for _ in range(self._settings.num_workers)))

    def info(self) -> RewardInfo:
        return RewardInfo(tasks=tuple(self._settings.tasks), scorers=dict(self._settings.tasks))

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        unknown = sorted({i.task for i in items} - set(self._settings.tasks))
        if unknown:
            raise ValueError(f"tasks {unknown} are not served here; this service scores {sorted(self._settings.tasks)}")
        return list(await asyncio.gather(*(self._score_item(item) for item in items)))

    async def _score_item(self, item: ScoreItem) -> ScoreResult:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, _score_one, self._settings.tasks[item.task],
                                      item.completion, item.ground_truth)
        try:
            return await asyncio.wait_for(future, self._settings.item_timeout_s)
        except TimeoutError:
            self._log.warning("score_timeout", task=item.task, timeout_s=self._settings.item_timeout_s)
        except ValueError as exc:  # e.g. an unparsable ground truth: the item scores 0, the batch goes on
            self._log.warning("score_failed", task=item.task, error=str(exc))
        return _ZERO

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
