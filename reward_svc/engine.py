"""The reward engine: routes each item to its task's scorer and runs scorers in a pool of
worker processes (never on the gRPC event loop), with a hard per-item time limit: an item
over it scores 0 and its worker is killed and replaced (reward_svc/workers.py).

Code items run in the sandbox (reward_svc/sandbox/), started from those workers; settings
validation keeps the per-item limit above the sandbox's own wall clock.

`reward_model` items are the exception: the model is loaded once, in this process, during
warm_up (the service is NOT_SERVING until then), and a Score call's reward-model items are
scored together in batches on the model's own thread (reward_svc/envs/reward_model.py).
"""

from __future__ import annotations

import asyncio
import json

from reward_svc.config import MULTI_TURN_SCORERS, RewardSettings
from reward_svc.envs import calculator, code, exact, math
from reward_svc.envs.reward_model import RewardModel
from reward_svc.types import RewardInfo, ScoreItem, ScoreResult, StepItem, StepResult, Turn
from reward_svc.workers import ScorerFailed, WorkerPool

_SCORERS = {
    "exact": lambda completion, truth, settings: exact.score(completion, truth),
    # math-verify's own (SIGALRM) timeouts, for parsing both sides and comparing, fit in the
    # item's limit; the worker kill is the backstop for what SIGALRM cannot interrupt
    "math": lambda completion, truth, settings: math.score(completion, truth,
                                                           timeout_s=max(1, int(settings.item_timeout_s / 4))),
    "code": lambda completion, truth, settings: code.score(completion, truth, settings.sandbox),
    "calculator": lambda completion, truth, settings: calculator.score(completion, truth),
}
# Multi-turn environments: step(prompt, ground_truth, history, completion, settings) -> StepResult.
_STEPPERS = {
    "calculator": lambda prompt, truth, history, completion, settings: calculator.step(
        prompt, truth, history, completion, settings.max_tool_calls),
}
assert set(_STEPPERS) == MULTI_TURN_SCORERS
_ZERO = ScoreResult(reward=0.0, correct=False)
_SELF_TEST = json.dumps({"tests": ["assert twice(2) == 4", "assert twice(3) == 7"], "entry_point": "twice"})


def _score_one(scorer: str, completion: str, ground_truth: str, settings: RewardSettings) -> ScoreResult:
    return _SCORERS[scorer](completion, ground_truth, settings)


def _step_one(scorer: str, prompt: str, ground_truth: str, history: tuple[Turn, ...], completion: str,
              settings: RewardSettings) -> StepResult:
    return _STEPPERS[scorer](prompt, ground_truth, history, completion, settings)


def _import_scorers() -> None:
    """Worker initializer. Unpickling it in a fresh worker imports this module, and with it
    every scorer (sympy via math-verify), before the worker takes a job with a deadline."""


class RewardEngine:
    """Scores batches for the tasks named in its settings."""

    def __init__(self, settings: RewardSettings, log):
        self._settings = settings
        self._log = log
        self._pool = WorkerPool(settings.num_workers, initializer=_import_scorers)
        self._reward_model: RewardModel | None = None

    async def warm_up(self) -> None:
        """Start the workers and import the scorers before the service reports SERVING; with a
        `code` task, check that the sandbox runs a program (a service that cannot sandbox
        refuses to start rather than score every code item 0)."""
        await self._pool.wait_ready()
        if "reward_model" in self._settings.tasks.values():
            self._reward_model = await RewardModel.load(self._settings.reward_model)
            self._log.info("reward_model_loaded", model=self._settings.reward_model.model_name)
        if "code" in self._settings.tasks.values():
            args = ("code", "def twice(x):\n    return 2 * x\n", _SELF_TEST, self._settings)
            try:
                reward = (await self._pool.run(_score_one, args, self._settings.item_timeout_s)).reward
            except (TimeoutError, ScorerFailed) as exc:
                raise RuntimeError(f"the code sandbox cannot run here: {exc}") from None
            if reward != 0.5:
                raise RuntimeError(f"the code sandbox failed its self-test (reward {reward}, expected 0.5)")

    def info(self) -> RewardInfo:
        tasks = self._settings.tasks
        return RewardInfo(tasks=tuple(tasks), scorers=dict(tasks),
                          multi_turn_tasks=tuple(t for t, s in tasks.items() if s in MULTI_TURN_SCORERS))

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        self._check_tasks(items)
        by_model = [i for i, item in enumerate(items) if self._settings.tasks[item.task] == "reward_model"]
        if not by_model:
            return list(await asyncio.gather(*(self._score_item(item) for item in items)))
        rest = sorted(set(range(len(items))) - set(by_model))
        model_results, rest_results = await asyncio.gather(
            self._score_with_model([items[i] for i in by_model]),
            asyncio.gather(*(self._score_item(items[i]) for i in rest)))
        results: list[ScoreResult] = [_ZERO] * len(items)
        for i, result in zip([*by_model, *rest], [*model_results, *rest_results]):
            results[i] = result
        return results

    async def _score_with_model(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """All reward-model items of a call, batched; a model failure fails the call (it is
        not the item's fault, and the coordinator retries the call)."""
        if self._reward_model is None:
            raise RuntimeError("the reward model is not loaded yet (warm_up has not finished)")
        return await self._reward_model.score(items)

    async def step(self, items: list[StepItem]) -> list[StepResult]:
        """Advance each episode by one turn. A single-turn task's episode ends at its first
        turn, with the completion's score; an environment that fails or times out ends the
        episode with reward 0 (the batch goes on)."""
        self._check_tasks(items)
        return list(await asyncio.gather(*(self._step_item(item) for item in items)))

    def _check_tasks(self, items: list[ScoreItem] | list[StepItem]) -> None:
        unknown = sorted({i.task for i in items} - set(self._settings.tasks))
        if unknown:
            raise ValueError(f"tasks {unknown} are not served here; this service scores {sorted(self._settings.tasks)}")

    async def _step_item(self, item: StepItem) -> StepResult:
        scorer = self._settings.tasks[item.task]
        if scorer not in MULTI_TURN_SCORERS:
            result = await self._score_item(ScoreItem(item.task, item.prompt, item.completion, item.ground_truth))
            return StepResult(done=True, reward=result.reward, correct=result.correct)
        try:
            return await self._pool.run(_step_one, (scorer, item.prompt, item.ground_truth, item.history,
                                                    item.completion, self._settings), self._settings.item_timeout_s)
        except TimeoutError:
            self._log.warning("step_timeout", task=item.task, timeout_s=self._settings.item_timeout_s)
        except ScorerFailed as exc:
            self._log.warning("step_failed", task=item.task, error=str(exc)[:500])
        return StepResult(done=True)

    async def _score_item(self, item: ScoreItem) -> ScoreResult:
        scorer = self._settings.tasks[item.task]
        if scorer == "reward_model":
            return (await self._score_with_model([item]))[0]
        try:
            return await self._pool.run(_score_one, (scorer, item.completion, item.ground_truth, self._settings),
                                        self._settings.item_timeout_s)
        except TimeoutError:
            self._log.warning("score_timeout", task=item.task, timeout_s=self._settings.item_timeout_s,
                              workers_replaced=self._pool.num_replaced)
        except ScorerFailed as exc:  # a bad ground truth, a broken sandbox: the item scores 0, the batch goes on
            self._log.warning("score_failed", task=item.task, error=str(exc)[:500])
        return _ZERO

    def close(self) -> None:
        self._pool.close()
        if self._reward_model is not None:
            self._reward_model.close()
