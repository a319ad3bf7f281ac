"""Reward routing: each sample goes to the reward service registered for its task; mixed
batches are split per task and merged back in order. Score (single-turn) and Step (a turn
of a multi-turn episode) route the same way. Also the per-task metrics of a mixed batch.

Swapping and failures (with `refresh`, as LoopContext.rewards() builds it): the service of a
task is looked up again before every call, so a service started for a task while a run goes
on takes the next call once the old one has left. A call that fails because its service is
gone (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ABORTED) is reported (`on_failure`: the
member is dropped) and retried, with exponential backoff, on whichever service then serves
the task, also when none does for a while. Past `retry_deadline_s` without success the run
pauses: a clear message is logged (and repeated every `pause_log_period_s`) until a service
for the task is back, and the call then goes through. Other errors (a bad request) raise.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from reward_svc.types import ScoreItem, ScoreResult, StepItem, StepResult
from tandem.rpc import RpcFailure


class RewardRouter:
    def __init__(self, clients_by_task: dict[str, object], *, refresh: Callable[[], dict[str, object]] | None = None,
                 on_failure: Callable[[object, Exception], None] | None = None, log=None,
                 initial_backoff_s: float = 0.25, max_backoff_s: float = 4.0, retry_deadline_s: float = 30.0,
                 pause_log_period_s: float = 30.0, sleep: Callable[[float], None] = time.sleep,
                 on_time: Callable[[float], None] | None = None):
        """on_time(seconds): told how long each score/step call took (the run's reward time)."""
        self._on_time = on_time or (lambda seconds: None)
        self._clients = clients_by_task
        self._refresh = refresh
        self._on_failure = on_failure or (lambda client, exc: None)
        self._log = log
        self._initial_backoff_s, self._max_backoff_s = initial_backoff_s, max_backoff_s
        self._retry_deadline_s, self._pause_log_period_s = retry_deadline_s, pause_log_period_s
        self._sleep = sleep

    @property
    def tasks(self) -> set[str]:
        return set(self._clients)

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        return self._route(items, lambda client, part: client.score(part))

    def step(self, items: list[StepItem]) -> list[StepResult]:
        return self._route(items, lambda client, part: client.step(part))

    def _route(self, items: list, call: Callable[[object, list], list]) -> list:
        started = time.perf_counter()
        try:
            return self._route_by_task(items, call)
        finally:
            self._on_time(time.perf_counter() - started)

    def _route_by_task(self, items: list, call: Callable[[object, list], list]) -> list:
        by_task: dict[str, list[int]] = defaultdict(list)
        for index, item in enumerate(items):
            by_task[item.task].append(index)
        missing = sorted(set(by_task) - set(self._clients))
        if missing and self._refresh is None:
            raise ValueError(f"no reward service serves tasks {missing}; live tasks: {sorted(self._clients)}")
        results: list = [None] * len(items)
        for task, indices in by_task.items():
            for index, result in zip(indices, self._call_task(task, [items[i] for i in indices], call)):
                results[index] = result
        return results

    def _call_task(self, task: str, part: list, call: Callable[[object, list], list]) -> list:
        if self._refresh is None:
            return call(self._clients[task], part)
        started = time.monotonic()
        backoff, last_error = self._initial_backoff_s, "no live reward service serves it"
        paused_at = last_pause_log = None
        while True:
            self._clients = self._refresh()
            client = self._clients.get(task)
            if client is not None:
                try:
                    result = call(client, part)
                except RpcFailure as exc:
                    if not exc.status.retryable:
                        raise
                    last_error = str(exc)
                    self._on_failure(client, exc)
                else:
                    if paused_at is not None:
                        self._warn("reward_resumed", task=task, paused_s=round(time.monotonic() - paused_at, 1))
                    return result
            now = time.monotonic()
            if now - started <= self._retry_deadline_s:
                self._warn("reward_retry", task=task, last_error=last_error, backoff_s=backoff)
            elif last_pause_log is None or now - last_pause_log >= self._pause_log_period_s:
                paused_at, last_pause_log = paused_at or now, now
                self._warn("reward_paused", task=task, last_error=last_error,
                           message=f"the run is paused: no reward service for task {task!r} has answered for "
                                   f"{now - started:.0f}s ({last_error}); start one (python -m reward_svc "
                                   f"--settings ... --coordinator <this run's coordinator address>) and it resumes")
            self._sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    def _warn(self, event: str, **fields) -> None:
        if self._log is not None:
            self._log.warning(event, **fields)


def per_task_metrics(tasks: Sequence[str], rewards: Sequence[float], correct: Sequence[bool],
                     num_turns: Sequence[int] | None = None) -> dict[str, float]:
    """`reward_mean/<task>`, `accuracy_train/<task>` and (given num_turns) `turns_mean/<task>`
    over the samples of each task."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for index, task in enumerate(tasks):
        by_task[task].append(index)
    metrics = {}
    for task, indices in sorted(by_task.items()):
        metrics[f"reward_mean/{task}"] = sum(rewards[i] for i in indices) / len(indices)
        metrics[f"accuracy_train/{task}"] = sum(bool(correct[i]) for i in indices) / len(indices)
        if num_turns is not None:
            metrics[f"turns_mean/{task}"] = sum(num_turns[i] for i in indices) / len(indices)
    return metrics


def check_tasks_configured(tasks_by_source: dict[str, set[str]], configured: set[str]) -> None:
    """Raise ConfigError when a dataset names a task that no `env.<task>` section serves (the
    run would otherwise start and then find no reward service for it)."""
    from coordinator.config import ConfigError

    problems = [f"{source} names tasks {sorted(tasks - configured)}" for source, tasks in tasks_by_source.items()
                if tasks - configured]
    if problems:
        raise ConfigError(f"{'; '.join(problems)} with no env section; configured tasks: {sorted(configured)}. "
                          "Add an env.<task> section (e.g. env.<task>.scorer=exact) or fix the data's task field")
