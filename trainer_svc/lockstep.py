"""Lockstep (SPMD) command channel: rank 0 broadcasts each command, every rank runs it.

Rank 0 calls `Lockstep.run(command, execute)`: the command is pickled to every rank over the
gloo `cpu_group`, every rank runs `execute(command)` in the same order, then each rank's
outcome (ok or the error text) is gathered to rank 0, which raises if any rank failed. So a
failure on any rank reaches the caller instead of leaving ranks silently apart. Ranks other
than 0 sit in `follow(execute)` until rank 0 sends `Shutdown`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Shutdown:
    """Ends `follow` on every rank."""


class RankFailed(RuntimeError):
    """A command failed on a rank other than 0 (rank 0's own failures propagate unchanged)."""


class Lockstep:
    """The command channel over `group` (all ranks of the trainer)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int):
        self._group = group
        self.rank = rank
        self.world_size = world_size

    def run(self, command: Any, execute: Callable[[Any], T]) -> T:
        """Rank 0: send `command`, run it here too, and raise if any rank failed."""
        assert self.rank == 0, "only rank 0 drives the lockstep"
        self._broadcast(command)
        result, error = _attempt(execute, command)
        failures = self._gather_outcomes(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        if failures:
            raise RankFailed("; ".join(failures))
        return result

    def follow(self, execute: Callable[[Any], object], on_error: Callable[[BaseException], None]) -> None:
        """Ranks > 0: run every command rank 0 sends until Shutdown."""
        assert self.rank != 0, "rank 0 drives the lockstep"
        while not isinstance(command := self._broadcast(None), Shutdown):
            _, error = _attempt(execute, command)
            if error is not None:
                on_error(error)
            self._gather_outcomes(None if error is None else f"{type(error).__name__}: {error}")

    def shutdown(self) -> None:
        """Rank 0: release the followers."""
        self._broadcast(Shutdown())

    def _broadcast(self, command: Any) -> Any:
        box = [command]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def _gather_outcomes(self, error: str | None) -> list[str]:
        outcomes: list | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(error, outcomes, dst=0, group=self._group)
        return [f"rank {r}: {e}" for r, e in enumerate(outcomes or []) if r > 0 and e is not None]


def _attempt(execute: Callable[[Any], T], command: Any) -> tuple[T | None, Exception | None]:
    try:
        return execute(command), None
    except Exception as exc:  # reported to rank 0 through the outcome gather
        return None, exc
