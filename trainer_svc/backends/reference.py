"""The frozen reference policy of a backend: the initial weights, kept as a second copy of this
rank's local parameter tensors and swapped into the live parameters in place (exactly, no
re-sharding) for the duration of a reference pass. Shared by the DTensor and Megatron backends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from trainer_svc.types import Policy


class ReferenceWeights:
    """`local(param)` gives the tensor that holds this rank's values of `param` (a DTensor's
    local shard, or the parameter itself); it is looked up at every swap."""

    def __init__(self, params: Sequence[torch.Tensor], local: Callable[[torch.Tensor], torch.Tensor] = lambda p: p):
        self._params = list(params)
        self._local = local
        with torch.no_grad():
            self._copies = [local(p).detach().clone() for p in self._params]

    @contextmanager
    def holding(self, policy: Policy) -> Iterator[None]:
        """Within the block the parameters hold `policy`'s weights ("current" changes nothing)."""
        if policy == "current":
            yield
            return
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def _swap(self) -> None:
        for param, copy in zip(self._params, self._copies):
            live = self._local(param).detach()
            tmp = live.clone()
            live.copy_(copy)
            copy.copy_(tmp)

    def clear(self) -> None:
        """Drop the copies (the backend is closing)."""
        self._copies.clear()
