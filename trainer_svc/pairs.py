"""Batch layout of the preference losses (DPO, Bradley-Terry): (chosen, rejected) pairs.

samples[2k] is chosen and samples[2k + 1] rejected. Rank shards and micro-batches are
contiguous slices (`trainer_svc.batching`), so pairs stay whole, chosen first, in every
micro-batch exactly when the global batch size is a multiple of 2 x the ranks and the
micro-batch size is even; the losses read rows 0::2 and 1::2.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer_svc.types import Sample


def validate_pairs(samples: Sequence[Sample], global_batch_size: int, micro_batch_size: int, world_size: int) -> None:
    """Raise ValueError saying what to change when the batch cannot be split into whole pairs."""
    if len(samples) % 2:
        raise ValueError(f"a preference batch holds (chosen, rejected) pairs: {len(samples)} samples is odd")
    if global_batch_size % (2 * world_size):
        raise ValueError(f"preference pairs: global_batch_size {global_batch_size} (samples) must be a multiple of "
                         f"2 x the {world_size} trainer ranks, so that every rank gets whole pairs")
    if micro_batch_size % 2:
        raise ValueError(f"preference pairs: micro_batch_size {micro_batch_size} (samples) must be even")
    for i, s in enumerate(samples):
        if s.loss_mask is not None and not any(m > 0 for m in s.loss_mask):
            raise ValueError(f"sample {i}: a preference sample needs at least one masked-in completion token")
