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

    def generators(self) -> list[GeneratorHandle]:
        return [GeneratorHandle(m.member_id, self._client(m, GeneratorClient), m.capacity)
                for m in self._registry.live("generator")]

    def generator_failed(self, handle: GeneratorHandle, exc: Exception) -> None:
        self._registry.remove(handle.member_id, reason=f"rpc failed: {exc}")
        client = self._clients.pop(handle.member_id, None)
        if client is not None:
            client.close()

    def rewards(self) -> RewardRouter:
        by_task: dict[str, RewardClient] = {}
        for member in self._registry.live("reward"):
            for task in member.tasks:
                by_task[task] = self._client(member, RewardClient)
        return RewardRouter(by_task)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
