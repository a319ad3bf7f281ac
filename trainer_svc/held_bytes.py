"""HeldBytes: how many bytes of gathered (full) weights a rank holds at once.

A backend's weight export registers every full tensor it makes (gathered TP shards, the HF
tensors converted from them, buffers received from other pipeline stages, `full_tensor()`
results); a tensor counts until Python frees it, wherever it went meanwhile (the sender's
packing loop, a state dict). Views count their storage once. `peak` is the high-water mark
since `reset()`: the figure that separates a streamed publish (about one gathered tensor)
from a whole-state-dict gather (the whole model). It is instrumentation, not a limit.
"""

from __future__ import annotations

import weakref

import torch


class HeldBytes:
    """A gauge of live gathered-weight bytes on this rank, with its peak."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self._live: dict[int, list[int]] = {}  # storage address -> [storage bytes, live tensors]

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        """Count `tensor` until it is freed; returns it."""
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if size == 0:
            return tensor
        entry = self._live.get(address)
        if entry is None:
            entry = self._live[address] = [size, 0]
            self.current += size
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        # the callback runs when the Python tensor is deallocated, before its memory is released
        weakref.finalize(tensor, self._release, address)
        return tensor

    def reset(self) -> None:
        """Start a new peak from what is live now."""
        self.peak = self.current

    def _release(self, address: int) -> None:
        entry = self._live[address]
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[address]
            self.current -= entry[0]
