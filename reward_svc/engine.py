"""The reward engine: each task's items go to that task's scorer object, built once from the
settings' `Scorer` (one per kind, shared by the tasks that use it).

- `PoolScorer` runs a scorer function in a pool of worker processes (never on the gRPC event
  loop), with a hard per-item time limit: an item over it scores 0 and its worker is killed and
  replaced (reward_svc/workers.py). Code items run in the sandbox (reward_svc/sandbox/), started
  from those workers; settings validation keeps the per-item limit above the sandbox's own wall
  clock, and warm-up checks that the sandbox runs at all. Multi-turn scorers step episodes there too.
- Agent tasks (settings `agents`) run whole episodes of user code against the run's rollout
  gateway (RunEpisode; reward_svc/agents.py), on the service's own agents loop.
- `ModelScorer` loads a reward model once, in this process, during warm-up (the service is
  NOT_SERVING until then), and scores a call's items together in batches on the model's own
  thread (reward_svc/envs/reward_model.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

from reward_svc.agents import EpisodeRunner
from reward_svc.config import RewardSettings, Scorer
from reward_svc.envs import calculator, code, exact
from reward_svc.envs.reward_model import RewardModel
from reward_svc.types import (
    EpisodeRequest,
    EpisodeResult,
    RewardInfo,
    ScoreItem,
    ScoreResult,
    StepItem,
    StepResult,
    Turn,
)
from reward_svc.workers import ScorerFailed, WorkerPool

_ZERO = ScoreResult(reward=0.0, correct=False)
_SELF_TEST = json.dumps({"tests": ["assert twice(2) == 4", "assert twice(3) == 7"], "entry_point": "twice"})


def _score_one(scorer: Scorer, completion: str, truth: str, settings: RewardSettings) -> ScoreResult:
    """Runs in a worker process."""
    if scorer is Scorer.EXACT:
        return exact.score(completion, truth)
    if scorer is Scorer.MATH:  # math-verify's own (SIGALRM) timeouts fit in the item's limit; the worker
        # kill is the backstop for what SIGALRM cannot interrupt
        from reward_svc.envs import math  # imported by the worker's initializer already

        return math.score(completion, truth, timeout_s=max(1, int(settings.item_timeout_s / 4)))
    if scorer is Scorer.CODE:
        return code.score(completion, truth, settings.sandbox)
    if scorer is Scorer.CALCULATOR:
        return calculator.score(completion, truth)
    raise ValueError(f"scorer {scorer.value} does not run in workers")


def _step_one(scorer: Scorer, prompt: str, truth: str, history: tuple[Turn, ...], completion: str,
              settings: RewardSettings) -> StepResult:
    """Runs in a worker process: one turn of a multi-turn environment."""
    if scorer is Scorer.CALCULATOR:
        return calculator.step(prompt, truth, history, completion, settings.max_tool_calls)
    raise ValueError(f"scorer {scorer.value} has no multi-turn environment")


_HEAVY_SCORERS = {Scorer.MATH: "reward_svc.envs.math"}
"""Scorers whose modules take long to import (math-verify brings sympy: ~0.9 CPU-s): imported
only by the workers of a service that has a task of that kind, never by the service's own
process. The light scorers come with this module."""


def _import_scorers(scorers: Iterable[Scorer]) -> None:
    """Worker initializer: imports the scorers this service uses (unpickling the initializer in
    a fresh worker imports this module, and with it the light ones) before the worker takes a
    job with a deadline."""
    for scorer in scorers:
        if scorer in _HEAVY_SCORERS:
            importlib.import_module(_HEAVY_SCORERS[scorer])


class PoolScorer:
    def __init__(self, scorer: Scorer, pool: WorkerPool, settings: RewardSettings, log):
        self._scorer, self._pool, self._settings, self._log = scorer, pool, settings, log

    async def warm_up(self) -> None:
        """A `code` scorer checks that the sandbox runs a program: a service that cannot sandbox
        refuses to start rather than score every code item 0."""
        if self._scorer is not Scorer.CODE:
            return
        args = (Scorer.CODE, "def twice(x):\n    return 2 * x\n", _SELF_TEST, self._settings)
        try:
            reward = (await self._pool.run(_score_one, args, self._settings.item_timeout_s)).reward
        except (TimeoutError, ScorerFailed) as exc:
            raise RuntimeError(f"the code sandbox cannot run here: {exc}") from None
        if reward != 0.5:
            raise RuntimeError(f"the code sandbox failed its self-test (reward {reward}, expected 0.5)")

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        return list(await asyncio.gather(*(self._score_item(item) for item in items)))

    async def _score_item(self, item: ScoreItem) -> ScoreResult:
        args = (self._scorer, item.completion, item.ground_truth, self._settings)
        return await self._run(_score_one, args, item.task, "score", _ZERO)

    async def step(self, item: StepItem) -> StepResult:
        """A multi-turn environment's next turn; a single-turn task's episode ends at its first
        turn, with the completion's score."""
        if not self._scorer.multi_turn:
            result = await self._score_item(ScoreItem(item.task, item.prompt, item.completion, item.ground_truth))
            return StepResult(done=True, reward=result.reward, correct=result.correct)
        args = (self._scorer, item.prompt, item.ground_truth, item.history, item.completion, self._settings)
        return await self._run(_step_one, args, item.task, "step", StepResult(done=True))

    async def _run(self, fn, args: tuple, task: str, what: str, failed):
        """fn(*args) in a worker; a timeout or an error is logged and yields `failed` (the batch goes on)."""
        try:
            return await self._pool.run(fn, args, self._settings.item_timeout_s)
        except TimeoutError:
            self._log.warning(f"{what}_timeout", task=task, timeout_s=self._settings.item_timeout_s,
                              workers_replaced=self._pool.num_replaced)
        except ScorerFailed as exc:  # a bad ground truth, a broken sandbox: the item scores 0
            self._log.warning(f"{what}_failed", task=task, error=str(exc)[:500])
        return failed

    def close(self) -> None:
        pass  # the pool is the engine's


class ModelScorer:
    """All reward-model items of a call, batched; a model failure fails the call (it is not the
    item's fault, and the coordinator retries the call)."""

    def __init__(self, settings: RewardSettings, log):
        self._settings, self._log = settings, log
        self._model: RewardModel | None = None

    async def warm_up(self) -> None:
        self._model = await RewardModel.load(self._settings.reward_model)
        self._log.info("reward_model_loaded", model=self._settings.reward_model.model_name)

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        if self._model is None:
            raise RuntimeError("the reward model is not loaded yet (warm_up has not finished)")
        return await self._model.score(items)

    async def step(self, item: StepItem) -> StepResult:
        (result,) = await self.score([ScoreItem(item.task, item.prompt, item.completion, item.ground_truth)])
        return StepResult(done=True, reward=result.reward, correct=result.correct)

    def close(self) -> None:
        if self._model is not None:
            self._model.close()


class RewardEngine:
    """Scores batches for the tasks named in its settings."""

    def __init__(self, settings: RewardSettings, log):
        self._settings = settings
        self._log = log
        used = frozenset(settings.tasks.values())
        self._pool = (WorkerPool(settings.num_workers, initializer=functools.partial(_import_scorers, used))
                      if any(not s.needs_model for s in used) else None)  # an agents-only service needs none
        kinds = {s: (ModelScorer(settings, log) if s.needs_model else PoolScorer(s, self._pool, settings, log))
                 for s in used}
        self._agents = EpisodeRunner(settings.agents, log) if settings.agents else None
        self._by_task = {task: kinds[s] for task, s in settings.tasks.items()}
        self._stopping = False
        self._calls = 0  # score/step calls in flight

    async def warm_up(self) -> None:
        """Start the workers and import the scorers, then warm each scorer up, before the service
        reports SERVING."""
        if self._pool is not None:
            await self._pool.wait_ready()
        for scorer in self._scorers():
            await scorer.warm_up()

    def info(self) -> RewardInfo:
        tasks, agents = self._settings.tasks, self._settings.agents
        return RewardInfo(tasks=tuple(self._settings.all_tasks),
                          scorers={**{t: s.value for t, s in tasks.items()},
                                   **{t: f"agent {a.function}" for t, a in agents.items()}},
                          multi_turn_tasks=tuple(t for t, s in tasks.items() if s.multi_turn),
                          agent_tasks=tuple(sorted(agents)))

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        self._check_tasks(items)
        async with self._call():
            return await self._score(items)

    async def _score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        groups: dict[PoolScorer | ModelScorer, list[int]] = defaultdict(list)  # scorer -> its items' indices
        for index, item in enumerate(items):
            groups[self._by_task[item.task]].append(index)
        parts = await asyncio.gather(*(scorer.score([items[i] for i in indices]) for scorer, indices in groups.items()))
        results: list[ScoreResult] = [_ZERO] * len(items)
        for indices, part in zip(groups.values(), parts):
            for index, result in zip(indices, part):
                results[index] = result
        return results

    async def step(self, items: list[StepItem]) -> list[StepResult]:
        """Advance each episode by one turn. A single-turn task's episode ends at its first
        turn, with the completion's score; an environment that fails or times out ends the
        episode with reward 0 (the batch goes on)."""
        self._check_tasks(items)
        async with self._call():
            return list(await asyncio.gather(*(self._by_task[item.task].step(item) for item in items)))

    async def run_episode(self, request: EpisodeRequest) -> EpisodeResult:
        """Run one agent episode to its end (reward_svc/agents.py): whatever the agent does, a
        result, never an error (an unknown task is the caller's: ValueError)."""
        if self._agents is None or request.task not in self._settings.agents:
            raise ValueError(f"task {request.task!r} has no agent here; this service runs agents for "
                             f"{sorted(self._settings.agents)}")
        async with self._call():
            return await self._agents.run(request)

    def drain_timeout_s(self, default_s: float) -> float:
        """How long a stopping service waits for its calls: default_s, or an agent episode's limit."""
        return max(default_s, self._agents.max_timeout_s() if self._agents is not None else 0.0)

    @contextlib.asynccontextmanager
    async def _call(self) -> AsyncIterator[None]:
        """One call in flight. Once the service stops, calls are refused as UNAVAILABLE (the caller
        sends them to another reward service), as are those the closing pool cuts off."""
        if self._stopping:
            raise ConnectionError("this reward service is stopping: send the request to another one")
        self._calls += 1
        try:
            yield
        finally:
            self._calls -= 1

    async def drain(self, timeout_s: float) -> None:
        """Refuse new calls; wait up to timeout_s for those in flight."""
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._log.info("drained" if not self._calls else "drain_timed_out", calls_left=self._calls)

    def _check_tasks(self, items: list[ScoreItem] | list[StepItem]) -> None:
        unknown = sorted({i.task for i in items} - set(self._settings.tasks))  # agent tasks are RunEpisode's
        if unknown:
            raise ValueError(f"tasks {unknown} are not served here; this service scores {sorted(self._settings.tasks)}")

    def close(self) -> None:
        self._stopping = True
        if self._pool is not None:
            self._pool.close()
        if self._agents is not None:
            self._agents.close()
        for scorer in self._scorers():
            scorer.close()

    def _scorers(self) -> list[PoolScorer | ModelScorer]:
        """Each scorer object once (tasks of one kind share it)."""
        return list({id(s): s for s in self._by_task.values()}.values())
