"""The layout of a weight transfer, without torch: where each tensor sits in the byte buckets
(`BucketPlan`, `TensorSpec`) and where one membership epoch's group meets (`GroupSpec`).
The coordinator and the services' typed clients import these; tandem/weight_sync.py, which
moves the bytes, needs torch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


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
    """Where every tensor of a model sits in the byte buckets of a transfer."""

    tensors: tuple[TensorSpec, ...]
    bucket_sizes_bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_sizes_bytes)

    def digest(self) -> int:
        """A 62-bit digest of the layout, checked by receivers in the header."""
        text = json.dumps([[t.name, list(t.shape), t.dtype, t.bucket_index, t.offset_bytes] for t in self.tensors])
        return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


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
