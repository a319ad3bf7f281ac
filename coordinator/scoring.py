"""Reward routing: each sample goes to the reward service registered for its task; mixed
batches are split per task and merged back in order."""

from __future__ import annotations

from collections import defaultdict

from reward_svc.types import ScoreItem, ScoreResult


class RewardRouter:
    def __init__(self, clients_by_task: dict[str, object]):
        self._clients = clients_by_task

    @property
    def tasks(self) -> set[str]:
        return set(self._clients)

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        by_task: dict[str, list[int]] = defaultdict(list)
        for index, item in enumerate(items):
            by_task[item.task].append(index)
        missing = sorted(set(by_task) - set(self._clients))
        if missing:
            raise ValueError(f"no reward service serves tasks {missing}; live tasks: {sorted(self._clients)}")
        results: list[ScoreResult | None] = [None] * len(items)
        for task, indices in by_task.items():
            for index, result in zip(indices, self._clients[task].score([items[i] for i in indices])):
                results[index] = result
        return results  # type: ignore[return-value]
