"""Typed handles on the live services, built from the membership registry.

The coordinator talks to services only through their `client` modules; this is where the
clients are made and cached per member, and where a member found dead is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.membership.registry import Member, Registry
from generator_svc.client import GeneratorClient
from reward_svc.client import RewardClient
from tandem.kinds import ServiceKind
from trainer_svc.client import TrainerClient


@dataclass(frozen=True)
class GeneratorHandle:
    """A live generator as the loop sees it."""

    member_id: str
    client: GeneratorClient  # (or an in-process twin with the same methods, in unit tests)
    capacity: int
    shares_trainer_weights: bool = False
    """Served by the trainer from its own weights: a publish reaches it without a transfer."""


class Services:
    def __init__(self, registry: Registry, token: str, log):
        self._registry = registry
        self._token = token
        self._log = log
        self._clients: dict[str, object] = {}

    def _client(self, member: Member, factory):
        client = self._clients.get(member.member_id)
        if client is None:
            client = self._clients[member.member_id] = factory(member.address, self._token)
        return client

    @property
    def trainer(self) -> TrainerClient:
        return self.trainer_of(ServiceKind.TRAINER)

    @property
    def critic(self) -> TrainerClient:
        """The PPO critic: a trainer service holding a value model (ServiceKind.CRITIC)."""
        return self.trainer_of(ServiceKind.CRITIC)

    def trainer_of(self, kind: ServiceKind) -> TrainerClient:
        """The live trainer service of `kind` (TRAINER: the policy's; CRITIC: a PPO run's critic)."""
        live = self._registry.live(kind)
        if not live:
            raise RuntimeError("no live trainer" if kind is ServiceKind.TRAINER else f"no live {kind}")
        return self._client(live[0], TrainerClient)

    def all_generators(self) -> list[GeneratorHandle]:
        """Every live generator, whatever weights it serves (the loop admits only current ones
        to rollouts: coordinator/loop/context.py)."""
        return [GeneratorHandle(m.member_id, self._client(m, GeneratorClient), m.capacity, m.shares_trainer_weights)
                for m in self._registry.live(ServiceKind.GENERATOR)]

    def teachers(self) -> list[GeneratorHandle]:
        """Every live distillation teacher (a generator service serving the teacher's fixed weights)."""
        return [GeneratorHandle(m.member_id, self._client(m, GeneratorClient), m.capacity)
                for m in self._registry.live(ServiceKind.TEACHER)]

    def forget(self, member_id: str) -> None:
        """Close the cached client of a member that is gone."""
        client = self._clients.pop(member_id, None)
        if client is not None:
            client.close()

    def generator_present(self, member_id: str) -> bool:
        """Still there, live or draining: its calls in flight may finish (coordinator/loop/rollout.py)."""
        return self._registry.present(member_id)

    def generator_failed(self, handle: GeneratorHandle, exc: Exception) -> None:
        self._registry.remove(handle.member_id, reason=f"rpc failed: {exc}")
        self.forget(handle.member_id)

    def reward_clients(self) -> dict[str, RewardClient]:
        """Task -> the client of the live reward service that serves it (looked up anew each call)."""
        by_task: dict[str, RewardClient] = {}
        for member in self._registry.live(ServiceKind.REWARD):  # sorted by member id: a task served twice takes one
            for task in member.tasks:
                by_task.setdefault(task, self._client(member, RewardClient))
        return by_task

    def environment_clients(self, task: str) -> list[RewardClient]:
        """The clients of every live service that serves `task` (an agent task's environment
        services: its episodes are spread over all of them)."""
        return [self._client(m, RewardClient) for m in self._registry.live(ServiceKind.REWARD) if task in m.tasks]

    def reward_failed(self, client: RewardClient, exc: Exception) -> None:
        """Drop the member of `client`; safe when several callers report the same one at once
        (an environment service's episodes all fail together when it dies)."""
        for member_id, known in list(self._clients.items()):
            if known is client:
                self._registry.remove(member_id, reason=f"rpc failed: {exc}")
                dropped = self._clients.pop(member_id, None)
                if dropped is not None:
                    dropped.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
