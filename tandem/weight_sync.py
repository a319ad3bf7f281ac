"""The weight-sync wire: trainer rank 0 broadcasts weights to generators over a
torch.distributed process group of its own (gloo on CPU, NCCL on CUDA).

How a transfer meets (see docs/architecture.md, "Weight sync"):
- Trainer rank 0 hosts a `TCPStore` (`WeightSender`), listening on the host it is given
  only (cluster.host: 127.0.0.1 on one host; the advertised address on several) and, with
  the run's token as `secret` on both sides, sealed (tandem/stores.py): a client without the
  token learns nothing from it and cannot plant values the members accept. For each
  membership epoch the coordinator announces a `GroupSpec`: store address, epoch, a random
  per-epoch secret and the world size. Members build the group directly on
  `PrefixStore(f"{epoch}-{secret}")`, so it never touches the trainer's default group, and a
  process that was not told the secret cannot join it. Trainer rank 0 is group rank 0;
  generators take 1..N.
- Weights travel as byte buckets laid out by a `BucketPlan` (HF names, shapes, dtypes,
  offsets), computed once per model and sent to receivers over gRPC. Each transfer starts
  with a header broadcast (version, bucket count, plan digest) that receivers check. The
  sender takes the tensors in plan order as they are gathered and packs them straight into
  the bucket being filled (`iter_buckets`): the full model is never held at once.
- Every collective has a per-operation timeout: gloo's `abort()` does not interrupt a
  pending wait, so a dead peer is only noticed through the timeout (notes/distributed-cpu).
  How the group is built, its NCCL error policy, the device-kind check of both ends and what
  "complete" means on NCCL (the stream is synchronized): tandem/weight_group.py.
- The receiver returns a complete staged state dict or raises: the caller swaps it in
  only once everything arrived, so a half-received update never serves a request.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
import torch.distributed as dist

from tandem.stores import SealedStore, serve_store
from tandem.weight_group import EpochGroup, _split_address, broadcast, complete
from tandem.weight_plan import BucketPlan, GroupSpec, TensorSpec

__all__ = ["BucketPlan", "GroupSpec", "TensorSpec", "WeightReceiver", "WeightSender", "make_bucket_plan"]

DEFAULT_BUCKET_BYTES = 256 << 20
_ALIGN_BYTES = 64  # keeps every tensor's byte offset a multiple of any element size


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_bucket_plan(tensors: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> BucketPlan:
    """Pack tensors in the given order into buckets of at most bucket_bytes.

    A tensor larger than bucket_bytes gets a bucket of its own.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    specs: list[TensorSpec] = []
    sizes: list[int] = []
    offset = 0
    for name, shape, dtype in tensors:
        size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        if not sizes or (offset > 0 and offset + size > bucket_bytes):
            if sizes:
                sizes[-1] = offset
            sizes.append(0)
            offset = 0
        specs.append(TensorSpec(name, tuple(int(s) for s in shape), dtype_name(dtype), len(sizes) - 1, offset, size))
        offset = _align(offset + size)
    if sizes:
        sizes[-1] = offset
    return BucketPlan(tuple(specs), tuple(sizes))


def plan_for_state_dict(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None,
                        bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> BucketPlan:
    return make_bucket_plan(((n, tuple(t.shape), dtype or t.dtype) for n, t in state.items()), bucket_bytes)


def _align(n: int) -> int:
    return (n + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES


def _header(version: int, plan: BucketPlan, device: torch.device) -> torch.Tensor:
    return torch.tensor([version, len(plan.bucket_sizes_bytes), plan.total_bytes, plan.digest()],
                        dtype=torch.int64, device=device)


class WeightSender:
    """Trainer rank 0's side: hosts the store and broadcasts buckets, double-buffered: one
    bucket fills while the previous one is on the wire (two buckets of buffer in all)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, device: torch.device | None = None,
                 advertise_host: str | None = None, secret: str | None = None):
        """The store listens on host:port alone; `secret` (the run's token; receivers pass the
        same) seals it, None leaves it open to any client that reaches it (tests, benchmarks)."""
        self._server = serve_store(host, port, timeout_s=60)
        self._store = self._server if secret is None else SealedStore(self._server, secret, "weight-sync")
        self._advertise = advertise_host or host
        self._device = device or torch.device("cpu")
        self._group = EpochGroup()

    @property
    def address(self) -> str:
        return f"{self._advertise}:{self._server.port}"

    def send(self, spec: GroupSpec, version: int, plan: BucketPlan,
             tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Broadcast `tensors` (full tensors, in plan order: see `iter_buckets`) as `version`,
        bucket by bucket while they are produced; returns bytes sent.

        Raises on timeout or a dead peer (the caller retries on a new epoch) and ValueError on a
        tensor the plan does not expect; either way the group is closed under the receivers.
        """
        try:
            return self._send(spec, version, plan, tensors)
        except Exception:
            self._group.close(failed=True)  # never reuse a group that failed mid-transfer
            raise

    def _send(self, spec: GroupSpec, version: int, plan: BucketPlan,
              tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        group = self._group.get(self._store, spec, 0, self._device)
        complete(broadcast(group, _header(version, plan, self._device), spec.op_timeout_s), self._device)
        buffers = [torch.empty(size, dtype=torch.uint8, device=self._device) for size in send_buffer_sizes(plan)]
        pending: list[dist.Work | None] = [None, None]

        def buffer_for(index: int, size: int) -> torch.Tensor:
            slot = index % 2
            if pending[slot] is not None:
                complete(pending[slot], self._device)  # the buffer is free again once its broadcast finished
                pending[slot] = None
            return buffers[slot][:size]

        for index, bucket in iter_buckets(plan, tensors, buffer_for):
            pending[index % 2] = broadcast(group, bucket, spec.op_timeout_s)
        for work in pending:
            if work is not None:
                complete(work, self._device)  # returns once every byte left: the caller's timing is the transfer's
        return plan.total_bytes

    def close(self) -> None:
        self._group.close()


def send_buffer_sizes(plan: BucketPlan) -> list[int]:
    """Bytes of the sender's two buffers: even buckets fill the first, odd ones the second."""
    sizes = plan.bucket_sizes_bytes
    return [max(sizes[slot::2]) for slot in range(min(2, len(sizes)))]


def iter_buckets(plan: BucketPlan, tensors: Iterable[tuple[str, torch.Tensor]],
                 buffer_for: Callable[[int, int], torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    """Pack `tensors` into the plan's buckets as they come; yield (index, bucket bytes) as each fills.

    `tensors` must come in plan order, full and one at a time (a generator that gathers each
    one is the point): each is packed, in the plan's dtype, as soon as it arrives and dropped,
    so what is held is the bucket being filled plus one tensor, never the whole model.
    `buffer_for(index, size)` hands out the bytes bucket `index` is packed into.

    A tensor whose name, position or shape is not the plan's raises ValueError before its
    bucket is yielded, and the last bucket is yielded only once `tensors` is exhausted, so a
    wrong, missing or extra tensor never lets a whole transfer out: receivers get the header
    and some buckets at most, and the sender's failure closes the group under them.
    """
    specs = plan.tensors
    positions = {spec.name: i for i, spec in enumerate(specs)}
    source = iter(tensors)
    position = 0
    for index, size in enumerate(plan.bucket_sizes_bytes):
        buffer = buffer_for(index, size)
        while position < len(specs) and specs[position].bucket_index == index:
            item = next(source, None)
            if item is None:
                raise ValueError(f"the weights ended after {position} of the bucket plan's {len(specs)} tensors: "
                                 f"{specs[position].name!r} and every later one are missing")
            name, tensor = item
            del item
            _check_against_plan(specs[position], position, positions, name, tensor)
            _pack(buffer, specs[position], tensor)
            del tensor  # the next tensor is made after this one is gone
            position += 1
        if index == len(plan.bucket_sizes_bytes) - 1:
            _check_exhausted(source, len(specs))
        yield index, buffer
        del buffer  # the caller is done with it: not held while the next one fills
    if not plan.bucket_sizes_bytes:
        _check_exhausted(source, 0)


def _check_against_plan(spec: TensorSpec, position: int, positions: dict[str, int], name: str,
                        tensor: torch.Tensor) -> None:
    if name != spec.name:
        if name not in positions:
            raise ValueError(f"tensor {name!r} is not in the bucket plan (it expects {spec.name!r} at position "
                             f"{position})")
        raise ValueError(f"tensor {name!r} came at position {position} but the bucket plan has it at "
                         f"{positions[name]} (it expects {spec.name!r} here): weights must come in plan order")
    if tuple(tensor.shape) != spec.shape:
        raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the bucket plan says {spec.shape}")


def _check_exhausted(source: Iterator[tuple[str, torch.Tensor]], count: int) -> None:
    extra = next(source, None)
    if extra is not None:
        raise ValueError(f"tensor {extra[0]!r} came after all {count} tensors of the bucket plan: it is not in the plan")


def _pack(buffer: torch.Tensor, spec: TensorSpec, tensor: torch.Tensor) -> None:
    flat = tensor.detach().to(device=buffer.device, dtype=getattr(torch, spec.dtype)).contiguous()
    buffer[spec.offset_bytes:spec.offset_bytes + spec.size_bytes].copy_(flat.view(-1).view(torch.uint8))


class WeightReceiver:
    """A generator's side: joins the epoch's group and receives one version.

    The device's extra memory is two buckets whatever the model's size: buckets arrive into two
    buffers on `device` (the next one posted while the last one is copied out) and each bucket
    is copied to `stage_device` as it completes. A generator on a GPU stages in host memory
    (pinned), outside vLLM's device budget, and vLLM's loaders copy each tensor onto the device
    as they take it, as when they load a checkpoint; on CPU both are the CPU (a copy per tensor,
    as before).
    """

    def __init__(self, device: torch.device | None = None, secret: str | None = None,
                 stage_device: torch.device | None = None):
        """`secret`: the run's token, as the sender's (None: an unsealed store)."""
        self._device = device or torch.device("cpu")
        self._stage_device = stage_device or self._device
        self._group = EpochGroup()
        self._secret = secret
        self._store: dist.Store | None = None
        self._store_address: str | None = None

    def _store_for(self, spec: GroupSpec) -> dist.Store:
        if self._store is None or self._store_address != spec.store_address:
            host, port = _split_address(spec.store_address)
            store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=spec.op_timeout_s))
            self._store = store if self._secret is None else SealedStore(store, self._secret, "weight-sync")
            self._store_address = spec.store_address
        return self._store

    def receive(self, spec: GroupSpec, rank: int, version: int, plan: BucketPlan) -> dict[str, torch.Tensor]:
        """Receive every bucket of `version`; returns the full staged state dict or raises."""
        try:
            return self._receive(spec, rank, version, plan)
        except Exception:
            self._group.close(failed=True)
            raise

    def _receive(self, spec: GroupSpec, rank: int, version: int, plan: BucketPlan) -> dict[str, torch.Tensor]:
        if not 1 <= rank < spec.world_size:
            raise ValueError(f"receivers take ranks 1..world_size-1 ({spec.world_size - 1}), got {rank}")
        group = self._group.get(self._store_for(spec), spec, rank, self._device)
        header = torch.zeros(4, dtype=torch.int64, device=self._device)
        complete(broadcast(group, header, spec.op_timeout_s), self._device)
        expected = _header(version, plan, self._device)
        if not torch.equal(header, expected):
            raise ConnectionError(f"weight-sync header {header.tolist()} does not match the announced "
                                  f"{expected.tolist()} (version, buckets, bytes, plan digest)")
        staged: dict[str, torch.Tensor] = {}
        for _, bucket, tensors in receive_buckets(group, plan, self._device, spec.op_timeout_s):
            if self._stage_device != self._device:  # one copy of the whole bucket, in pinned host memory
                bucket = torch.empty(bucket.shape, dtype=torch.uint8, device=self._stage_device,
                                     pin_memory=True).copy_(bucket)
            for t in tensors:
                raw = bucket[t.offset_bytes:t.offset_bytes + t.size_bytes]
                if self._stage_device == self._device:
                    raw = raw.clone()  # the buffer is refilled two buckets later
                staged[t.name] = raw.view(getattr(torch, t.dtype)).view(t.shape)
        return staged

    def close(self) -> None:
        self._group.close()


def receive_buckets(group: dist.ProcessGroup, plan: BucketPlan, device: torch.device, timeout_s: float
                    ) -> Iterator[tuple[int, torch.Tensor, list[TensorSpec]]]:
    """Receive the plan's buckets into two reused buffers on `device`; yield (index, the bucket's
    bytes, the specs of its tensors) as each one completes. The bytes are a view into a buffer
    that is refilled two buckets later: the caller copies out what it keeps before it asks for
    the next bucket. While it does, the next bucket is already posted into the other buffer."""
    by_bucket: dict[int, list[TensorSpec]] = {}
    for t in plan.tensors:
        by_bucket.setdefault(t.bucket_index, []).append(t)
    sizes = plan.bucket_sizes_bytes
    buffers = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(min(2, len(sizes)))]
    works = {0: broadcast(group, buffers[0][:sizes[0]], timeout_s)} if sizes else {}
    for index in range(len(sizes)):
        complete(works.pop(index), device)  # the bytes are in the buffer, not merely enqueued (NCCL)
        if index + 1 < len(sizes):  # keep the next receive posted while this one is copied out
            works[index + 1] = broadcast(group, buffers[(index + 1) % 2][:sizes[index + 1]], timeout_s)
        yield index, buffers[index % 2][:sizes[index]], by_bucket.get(index, [])


def iter_plan_tensors(plan: BucketPlan, state: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `state` in plan order (what WeightSender.send expects)."""
    for spec in plan.tensors:
        yield spec.name, state[spec.name]
