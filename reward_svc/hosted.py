"""A plain Python reward function served as a reward service, inside the caller's process.

The Python API (`coordinator.api.train(reward_fn=...)`) uses it: `FunctionEnv` is an engine with the
same face as `RewardEngine` (`info()`, `async score(items)`, `async step(items)`), so the
ordinary `RewardServicer` serves it; `FunctionRewardService` runs that gRPC server on a
background thread with its own event loop and registers it with the coordinator for its
task, like any reward service, so the coordinator's routing does not change.

    reward_fn(prompt: str, completion: str, answer: str) -> float

The function runs in a thread pool, never on the event loop. A completion counts as
correct (accuracy metrics) when its reward is > 0. An exception in the function, or a value
that is not a number, fails the call (and the run) with a message naming the item.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from reward_svc.server import SERVICE_NAME, RewardServicer, add_to_server
from reward_svc.types import RewardInfo, ScoreItem, ScoreResult, StepItem, StepResult
from tandem.kinds import ServiceKind
from tandem.membership import Announcement, Load, MembershipAgent
from tandem.rpc import start_server

RewardFn = Callable[[str, str, str], float]


class FunctionEnv:
    """Scores items of one task with a Python function (single-turn)."""

    def __init__(self, task: str, reward_fn: RewardFn, num_threads: int = 1):
        self.task = task
        self._fn = reward_fn
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix=f"reward-fn-{task}")

    def info(self) -> RewardInfo:
        return RewardInfo(tasks=(self.task,), scorers={self.task: "python"})

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        unknown = sorted({i.task for i in items} - {self.task})
        if unknown:
            raise ValueError(f"tasks {unknown} are not served here; this service scores [{self.task!r}]")
        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(*(loop.run_in_executor(self._pool, self._score_one, i) for i in items)))

    async def step(self, items: list[StepItem]) -> list[StepResult]:
        """Single-turn: every episode ends at its first turn with the completion's score."""
        scored = await self.score([ScoreItem(i.task, i.prompt, i.completion, i.ground_truth) for i in items])
        return [StepResult(done=True, reward=r.reward, correct=r.correct) for r in scored]

    def _score_one(self, item: ScoreItem) -> ScoreResult:
        try:
            value = self._fn(item.prompt, item.completion, item.ground_truth)
        except Exception as exc:
            raise ValueError(f"reward_fn raised {type(exc).__name__}: {exc} (prompt {item.prompt!r}, "
                             f"completion {item.completion!r}, answer {item.ground_truth!r})") from exc
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"reward_fn must return a finite float, got {value!r} (prompt {item.prompt!r})")
        return ScoreResult(reward=float(value), correct=value > 0)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class FunctionRewardService:
    """`FunctionEnv` behind a gRPC server on a daemon thread, registered with a coordinator.
    Meets `coordinator.launch.local.HostedService`: `start(coordinator, token, host)`, `stop()`."""

    def __init__(self, task: str, reward_fn: RewardFn, log, num_threads: int = 1):
        self.env = FunctionEnv(task, reward_fn, num_threads)
        self._log = log.bind(service="reward-fn", task=task)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"reward-fn-{task}", daemon=True)
        self._running = None
        self._agent: MembershipAgent | None = None
        self.address = ""

    def start(self, coordinator_address: str, token: str, host: str = "127.0.0.1") -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(coordinator_address, token, host), self._loop).result(timeout=30)

    async def _serve(self, coordinator_address: str, token: str, host: str) -> None:
        self._running = await start_server([lambda s: add_to_server(RewardServicer(self.env), s)], [SERVICE_NAME],
                                           host=host, port=0, token=token, log=self._log)
        await self._running.mark_ready()
        self.address = self._running.address
        self._agent = MembershipAgent(coordinator_address, token, Announcement(
            kind=ServiceKind.REWARD, address=self.address, tasks=[self.env.task]), Load, self._log)
        self._agent.start()
        self._log.info("service_ready", address=self.address)

    async def _shutdown(self) -> None:
        if self._agent is not None:
            await self._agent.stop()
        if self._running is not None:
            await self._running.stop(grace_s=1.0)

    def stop(self) -> None:
        """Deregister and stop serving; safe to call more than once."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self.env.close()
