"""The frozen reference policy of a backend: the initial weights, kept as a second copy of this
rank's local parameter tensors and swapped into the live parameters in place (exactly, no
re-sharding) for the duration of a reference pass. Shared by the DTensor and Megatron backends.

Half-size copies: a float32 parameter whose values all fit bfloat16 exactly (every one of them
when the checkpoint ships in bfloat16, as most do: the trainer upcasts it exactly) is kept in
bfloat16. A reference pass parks a clone of the live values (only during the pass; the
gradients are freed between steps, so this does not add to the step's peak) and upcasts the
copy into the parameters: they hold the reference's float32 values exactly, and get the live
ones back bit for bit. At Qwen2.5-0.5B's shape the copy is 0.99 GB instead of 1.98 GB for the
whole run. Other parameters keep a full copy, exchanged with the live values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from trainer_svc.types import Policy


def _reference_copy(tensor: torch.Tensor, compact: bool) -> torch.Tensor:
    """A bfloat16 copy of a float32 tensor whose values it holds exactly; else a clone."""
    if compact and tensor.dtype == torch.float32:
        narrow = tensor.bfloat16()
        if torch.equal(narrow.float(), tensor):
            return narrow
    return tensor.clone()


def expand_copy(copy: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A copy as the tensor of `like`'s dtype it stands for (exact)."""
    return copy.to(like.dtype) if copy.dtype != like.dtype else copy.clone()


class ReferenceWeights:
    """`local(param)` gives the tensor that holds this rank's values of `param` (a DTensor's
    local shard, or the parameter itself); it is looked up at every swap. compact=False keeps
    full-size copies of every parameter."""

    def __init__(self, params: Sequence[torch.Tensor], local: Callable[[torch.Tensor], torch.Tensor] = lambda p: p,
                 *, compact: bool = True, before_swap: Callable[[], None] = lambda: None):
        self._params = list(params)
        self._before_swap = before_swap  # e.g. a background checkpoint write still reading the parameters
        self._local = local
        with torch.no_grad():
            self._copies = [_reference_copy(local(p).detach(), compact) for p in self._params]
        self._parked: dict[int, torch.Tensor] = {}  # the live values of half-size copies' parameters, during a pass

    @property
    def num_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self._copies)

    @contextmanager
    def holding(self, policy: Policy) -> Iterator[None]:
        """Within the block the parameters hold `policy`'s weights ("current" changes nothing)."""
        if policy == "current":
            yield
            return
        self._before_swap()
        self._swap(to_reference=True)
        try:
            yield
        finally:
            self._swap(to_reference=False)

    @torch.no_grad()
    def _swap(self, *, to_reference: bool) -> None:
        for i, (param, copy) in enumerate(zip(self._params, self._copies)):
            live = self._local(param).detach()
            if copy.dtype == live.dtype:  # a full copy: exchanged
                tmp = live.clone()
                live.copy_(copy)
                copy.copy_(tmp)
            elif to_reference:
                self._parked[i] = live.clone()
                live.copy_(copy)  # bfloat16 -> float32: exact
            else:
                live.copy_(self._parked.pop(i))

    def clear(self) -> None:
        """Drop the copies (the backend is closing)."""
        self._copies.clear()
        self._parked.clear()
