"""What a weight-sync receiver reads out of packed buckets, without a group: for tests that
check what a publish carries (tandem.weight_sync.iter_buckets packs; this unpacks)."""

import torch

from tandem.weight_sync import BucketPlan, iter_buckets


def unpack(plan: BucketPlan, tensors) -> dict[str, torch.Tensor]:
    """Pack `tensors` (name, tensor in plan order) into the plan's buckets and read every tensor back."""
    buckets = {i: b.clone() for i, b in iter_buckets(plan, tensors, lambda i, n: torch.empty(n, dtype=torch.uint8))}
    return {s.name: buckets[s.bucket_index][s.offset_bytes:s.offset_bytes + s.size_bytes]
            .view(getattr(torch, s.dtype)).view(s.shape) for s in plan.tensors}
