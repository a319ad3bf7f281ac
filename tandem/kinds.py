"""The kinds of service a run is made of, one enum for the whole project.

It mirrors the membership contract's `ServiceKind` (protos/tandem/coordinator/v1/coordinator.proto),
whose generated code stays at the transport edges: `tandem.membership` and the coordinator's
membership server convert at the wire, everything else compares members to these values.
A `StrEnum`, so a kind prints, logs and formats as its lowercase name ("generator").
"""

from __future__ import annotations

from enum import StrEnum


class ServiceKind(StrEnum):
    TRAINER = "trainer"
    """Trains the policy (and, with policy.generation.backend megatron, generates from it too)."""
    GENERATOR = "generator"
    """Samples rollouts from the policy's weights."""
    REWARD = "reward"
    """Scores completions for the tasks it names."""
    TEACHER = "teacher"
    """A generator service serving a distillation teacher: scores the policy's tokens under its own
    fixed weights; never in the policy's rotation, never sent weights."""
    CRITIC = "critic"
    """A trainer service holding a PPO critic (a value model, its own torchrun): values the policy's
    samples and trains on their returns; never publishes weights."""

    @property
    def holds_weights(self) -> bool:
        """Whether the member serves a version of the policy's weights (a trainer or a generator)."""
        return self in (ServiceKind.TRAINER, ServiceKind.GENERATOR)
