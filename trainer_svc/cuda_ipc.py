"""The trainer's side of CUDA IPC weight passing (colocated generators on GPUs).

Every rank runs the backend's streamed export (`iter_hf_tensors`: one full HF-named tensor at
a time, on the device); rank 0 packs each tensor into the bucket plan's buckets on its device
as it arrives (no full state dict, no trip through host memory) and exports a handle per
bucket (tandem.cuda_ipc). The buckets are held here until the coordinator
releases them, after every generator has confirmed the version (it has copied the tensors
into its model by then): freeing them earlier would let the caching allocator hand their memory
to the next allocation while a generator still reads it. One export is held at a time; a new
one replaces an unreleased one (a coordinator that died mid-publish leaks nothing for long).

Every rank empties torch's CUDA cache when an export is made and released: memory the trainer
has freed but cached is otherwise invisible to the generators that wake up next to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from tandem.cuda_ipc import device_uuid, export_handle, pack_buckets
from tandem.weight_sync import BucketPlan


class CudaIpcExports:
    """The export held by this rank (rank 0 only ever holds one)."""

    def __init__(self, device: torch.device, log: Any, *, reduce: Callable | None = None,
                 uuid_of: Callable[[int], str] = device_uuid, empty_cache: Callable[[], None] | None = None):
        self._device = device
        self._log = log
        self._reduce = reduce  # None: torch's reduce_tensor (tests pass a fake)
        self._uuid_of = uuid_of
        self._empty_cache = empty_cache or torch.cuda.empty_cache
        self._held: tuple[int, list[torch.Tensor]] | None = None

    @property
    def held_version(self) -> int | None:
        return None if self._held is None else self._held[0]

    def export(self, version: int, plan: BucketPlan, tensors: Iterable[tuple[str, torch.Tensor]], *,
               leader: bool) -> list[bytes] | None:
        """Collective (every rank, with its part of the export): rank 0 (`leader`) packs `tensors`
        as `version` and returns a handle per bucket; other ranks return None. The export is
        always run to its end, even when packing fails, since the other ranks' gathers wait
        for this rank's part in them."""
        if self._held is not None:
            self._log.warning("cuda_ipc_export_replaced", version=self._held[0], new_version=version)
        self._held = None
        self._empty_cache()
        tensors = iter(tensors)
        try:
            if not leader:
                return None
            buffers = pack_buckets(plan, tensors, self._device)
        finally:
            for _ in tensors:
                pass
        uuid = self._uuid_of(self._device.index if self._device.index is not None else 0)
        payloads = [export_handle(buffer, uuid, reduce=self._reduce) for buffer in buffers]
        self._held = (version, buffers)
        return payloads

    def release(self, version: int) -> bool:
        """Drop the buckets of `version` (another version's are kept); whether they were held."""
        released = self._held is not None and self._held[0] == version
        if released:
            self._held = None
        self._empty_cache()
        return released
