"""Proto <-> dataclass conversion of the shared weight-sync messages (tandem.common.v1).

Used by the trainer's and the generator's server.py/client.py; domain code only sees the
dataclasses of `tandem.weight_sync`.
"""

from __future__ import annotations

from protos.tandem.common.v1 import common_pb2
from tandem.weight_sync import BucketPlan, GroupSpec, TensorSpec


def plan_to_pb(plan: BucketPlan) -> common_pb2.BucketPlan:
    return common_pb2.BucketPlan(
        tensors=[common_pb2.TensorSpec(name=t.name, shape=list(t.shape), dtype=t.dtype, bucket_index=t.bucket_index,
                                       offset_bytes=t.offset_bytes, size_bytes=t.size_bytes) for t in plan.tensors],
        bucket_sizes_bytes=list(plan.bucket_sizes_bytes))


def plan_from_pb(pb: common_pb2.BucketPlan) -> BucketPlan:
    return BucketPlan(
        tuple(TensorSpec(t.name, tuple(t.shape), t.dtype, t.bucket_index, t.offset_bytes, t.size_bytes)
              for t in pb.tensors),
        tuple(pb.bucket_sizes_bytes))


def group_to_pb(group: GroupSpec) -> common_pb2.WeightSyncGroup:
    return common_pb2.WeightSyncGroup(store_address=group.store_address, epoch=group.epoch,
                                      epoch_secret=group.epoch_secret, world_size=group.world_size,
                                      op_timeout_ms=int(group.op_timeout_s * 1000))


def group_from_pb(pb: common_pb2.WeightSyncGroup) -> GroupSpec:
    if not pb.store_address or pb.world_size < 1:  # 1: the trainer alone (a publish with nothing to send)
        raise ValueError("weight-sync group needs a store address and at least 1 member (the trainer)")
    return GroupSpec(pb.store_address, pb.epoch, pb.epoch_secret, pb.world_size,
                     (pb.op_timeout_ms or 30_000) / 1000)
