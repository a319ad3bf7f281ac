"""One weight version to every vLLM worker of a generator (tensor/pipeline parallel > 1).

Every worker reloads the whole HF-named version (vLLM's weight loaders take each worker's shard
of a full tensor, and skip the layers of other pipeline stages), but only the generator's first
worker joins the weight-sync group: it receives the buckets, then broadcasts them bucket by
bucket over vLLM's own group of the generator's workers, and the other workers unpack the same
plan. The coordinator's group keeps one rank per generator whatever its layout.

On CPU the buckets go over vLLM's CPU group (gloo). On GPUs they go over its device group (NCCL,
vllm.distributed's world group `device_group`) through one bucket-sized buffer on the device, and
each worker copies every bucket to pinned host memory, where the version is staged (staging.py):
gloo over the host's sockets would carry the whole model once per extra worker.

Measured against the other choice, one weight-sync receiver per worker:
benchmarks/vllm_tp_weight_fanout.py times both.

A worker that failed to receive first broadcasts the failure, so the others raise too instead
of waiting for buckets that never come.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from tandem.weight_sync import BucketPlan

_OK, _FAILED = 0, 1


def fan_out(receive: Callable[[], dict[str, torch.Tensor]], plan: BucketPlan, group: dist.ProcessGroup,
            source_rank: int, is_source: bool, device_group: dist.ProcessGroup | None = None,
            device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """On the source worker, `receive()` the version and broadcast it; on the others, receive the
    broadcast. Returns the version's tensors (HF names) on every worker or raises on every worker.
    `source_rank` is the source's global rank (torch.distributed's numbering) in `group`; with a
    CUDA `device`, the bytes go over `device_group` (NCCL) instead of `group`."""
    staged: dict[str, torch.Tensor] = {}
    failure: BaseException | None = None
    if is_source:
        try:
            staged = receive()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the others were told
            failure = exc
    flag = torch.tensor([_FAILED if failure else _OK], dtype=torch.int64)
    dist.broadcast(flag, src=source_rank, group=group)
    if failure is not None:
        raise failure
    if int(flag.item()) != _OK:
        raise ConnectionError("the generator's first vLLM worker failed to receive this weight version")
    if device is not None and device.type == "cuda" and device_group is not None:
        return _broadcast_buckets(staged, plan, device_group, source_rank, is_source, _DeviceWire(device, plan))
    return _broadcast_buckets(staged, plan, group, source_rank, is_source, None)


class _DeviceWire:
    """One bucket-sized buffer on the worker's device that each host bucket crosses over NCCL."""

    def __init__(self, device: torch.device, plan: BucketPlan):
        self._buffer = torch.empty(max(plan.bucket_sizes_bytes, default=0), dtype=torch.uint8, device=device)

    def broadcast(self, bucket: torch.Tensor, src: int, group: dist.ProcessGroup, is_source: bool) -> None:
        wire = self._buffer[:bucket.numel()]
        if is_source:
            wire.copy_(bucket)  # on the current stream, which waited for the last broadcast (work.wait)
        dist.broadcast(wire, src=src, group=group)
        if not is_source:
            bucket.copy_(wire)  # device to pinned host, synchronous: the bytes are there on return


def _broadcast_buckets(staged: dict[str, torch.Tensor], plan: BucketPlan, group: dist.ProcessGroup,
                       source_rank: int, is_source: bool, wire: _DeviceWire | None) -> dict[str, torch.Tensor]:
    by_bucket: dict[int, list] = {}
    for spec in plan.tensors:
        by_bucket.setdefault(spec.bucket_index, []).append(spec)
    out: dict[str, torch.Tensor] = {}
    for index, size in enumerate(plan.bucket_sizes_bytes):
        bucket = torch.empty(size, dtype=torch.uint8, pin_memory=wire is not None)
        specs = by_bucket.get(index, [])
        if is_source:
            for spec in specs:
                flat = staged[spec.name].detach().to("cpu").contiguous().view(-1).view(torch.uint8)
                bucket[spec.offset_bytes:spec.offset_bytes + spec.size_bytes].copy_(flat)
        if wire is None:
            dist.broadcast(bucket, src=source_rank, group=group)
        else:
            wire.broadcast(bucket, source_rank, group, is_source)
        if is_source:
            continue
        for spec in specs:  # views into this bucket, which they keep alive
            raw = bucket[spec.offset_bytes:spec.offset_bytes + spec.size_bytes]
            out[spec.name] = raw.view(getattr(torch, spec.dtype)).view(spec.shape)
    return staged if is_source else out
