"""The layout of a weight transfer, without torch: where each tensor sits in the byte buckets
(`BucketPlan`, `TensorSpec`) and where one membership epoch's group meets (`GroupSpec`).
The coordinator and the services' typed clients import these; tandem/weight_sync.py, which
moves the bytes, needs torch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

DEFAULT_BUCKET_BYTES = 64 << 20
"""Bytes per weight-sync bucket (`weight_sync_bucket_bytes`). Where a trainer's parameters are one
block laid out as the plan (trainer_svc/publish.py) every bucket is sent from there: at
Qwen2.5-0.5B's shape 64 MiB buckets (25) put the wire at 83-88% of a raw broadcast's bandwidth,
256 MiB ones (7) at 69-84%, 16 MiB ones at 68% (benchmarks/results/2026-12-02-parameter-block.md)."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor in a bucket (HF parameter name, full shape)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bucket_index: int
    offset_bytes: int
    size_bytes: int


@dataclass(frozen=True)
class BucketPlan:
    """Where every tensor of a model sits in the byte buckets of a transfer, and which buckets
    share a checksum window.

    `window_ends`: where each checksum window ends (bucket indices, exclusive, ascending, the
    last one the number of buckets). The checksums of a window's buckets travel together, in one
    broadcast after its last bucket, and a receiver hands a window's buckets out once that
    broadcast arrived and matched. Empty: every bucket is a window of its own."""

    tensors: tuple[TensorSpec, ...]
    bucket_sizes_bytes: tuple[int, ...]
    window_ends: tuple[int, ...] = ()
    in_block: bool = False
    """The sender's side only (not on the wire, not in the digest): its tensors lie in one block
    laid out as this plan (tandem.weight_sync.plan_block_views), so a bucket of several tensors
    goes out from that memory; otherwise only a bucket of one tensor can."""

    def __post_init__(self) -> None:
        ends, count = self.window_ends, len(self.bucket_sizes_bytes)
        if ends and (ends[-1] != count or any(b <= a for a, b in zip((0, *ends), ends))):
            raise ValueError(f"checksum window ends {list(ends)} must rise strictly and end at the bucket count {count}")

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_sizes_bytes)

    def windows(self) -> list[range]:
        """The checksum windows, each the range of its buckets' indices, in order."""
        ends = self.window_ends or tuple(range(1, len(self.bucket_sizes_bytes) + 1))
        return [range(start, end) for start, end in zip((0, *ends), ends)]

    def digest(self) -> int:
        """A 62-bit digest of the layout and its checksum windows, checked by receivers in the header
        (a plan of one window per bucket digests as before windows existed)."""
        layout = [[t.name, list(t.shape), t.dtype, t.bucket_index, t.offset_bytes] for t in self.tensors]
        text = json.dumps(layout + [list(self.window_ends)] if self.window_ends else layout)
        return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


def checksum_window_ends(bucket_sizes: tuple[int, ...], window_bytes: int | None) -> tuple[int, ...]:
    """Group consecutive buckets into checksum windows of at least `window_bytes` each (the last
    may hold fewer; a bucket never splits); None: every bucket a window of its own (`BucketPlan`)."""
    if window_bytes is None:
        return ()
    if window_bytes <= 0:
        raise ValueError(f"checksum window bytes must be positive (or None), got {window_bytes}")
    ends: list[int] = []
    held = 0
    for index, size in enumerate(bucket_sizes):
        held += size
        if held >= window_bytes:
            ends.append(index + 1)
            held = 0
    if bucket_sizes and (not ends or ends[-1] != len(bucket_sizes)):
        ends.append(len(bucket_sizes))  # the last window, short of window_bytes
    return tuple(ends)


@dataclass(frozen=True)
class GroupSpec:
    """Where and how one epoch's group meets."""

    store_address: str
    epoch: int
    epoch_secret: str
    world_size: int
    op_timeout_s: float = 30.0

    @property
    def key(self) -> tuple[str, int, str, int]:
        return (self.store_address, self.epoch, self.epoch_secret, self.world_size)
