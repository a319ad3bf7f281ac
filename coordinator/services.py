"""Typed handles on the live services, built from the membership registry.

The coordinator talks to services only through their `client` modules; this is where the
clients are made and cached per member.
"""

from __future__ import annotations

from coordinator.registry import Member, Registry
from coordinator.rollout import GeneratorHandle
from coordinator.scoring import RewardRouter
from generator_svc.client import GeneratorClient
from reward_svc.client import RewardClient
from trainer_svc.client import TrainerClient


class Services:
    def __init__(self, registry: Registry, token: str, log):
        self._registry = registry
        self._token = token
        self._log = log
        self._clients: dict[str, object] = {}
        self._trainer: TrainerClient | None = None
        self.weights = None  # a WeightPublisher: generators() then admits only those serving its version

    def _client(self, member: Member, factory):
        client = self._clients.get(member.member_id)
        if client is None:
            client = self._clients[member.member_id] = factory(member.address, self._token)
        return client

    @property
    def trainer(self) -> TrainerClient:
        trainers = self._registry.live("trainer")
        if not trainers:
            raise RuntimeError("no live trainer")
        return self._client(trainers[0], TrainerClient)

    def all_generators(self) -> list[GeneratorHandle]:
        """Every live generator, whatever weights it serves (what a publish goes to)."""
        return [GeneratorHandle(m.member_id, self._client(m, GeneratorClient), m.capacity, m.shares_trainer_weights)
                for m in self._registry.live("generator")]

    def generators(self) -> list[GeneratorHandle]:
        """The live generators that may get work: with a publisher set, only those serving
        its version (stale ones are brought up to date first where possible)."""
        handles = self.all_generators()
        return handles if self.weights is None else self.weights.admit(handles)

    def forget(self, member_id: str) -> None:
        """Close the cached client of a member that is gone."""
        client = self._clients.pop(member_id, None)
        if client is not None:
            client.close()

    def generator_present(self, member_id: str) -> bool:
        """Still there, live or draining: its calls in flight may finish (coordinator/rollout.py)."""
        return self._registry.present(member_id)

    def generator_failed(self, handle: GeneratorHandle, exc: Exception) -> None:
        self._registry.remove(handle.member_id, reason=f"rpc failed: {exc}")
        client = self._clients.pop(handle.member_id, None)
        if client is not None:
            client.close()

    def rewards(self) -> RewardRouter:
        """Routes by task to the live reward services, looked up again before every call (so a
        swapped service takes over at once), retrying a dead one's calls (coordinator/scoring.py)."""
        return RewardRouter(self._reward_clients(), refresh=self._reward_clients, on_failure=self._reward_failed,
                            log=self._log)

    def _reward_clients(self) -> dict[str, RewardClient]:
        by_task: dict[str, RewardClient] = {}
        for member in self._registry.live("reward"):  # sorted by member id: a task served twice takes one
            for task in member.tasks:
                by_task.setdefault(task, self._client(member, RewardClient))
        return by_task

    def _reward_failed(self, client: RewardClient, exc: Exception) -> None:
        for member_id, known in list(self._clients.items()):
            if known is client:
                self._registry.remove(member_id, reason=f"rpc failed: {exc}")
                self._clients.pop(member_id).close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
