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
  the bucket being filled (`iter_buckets`): the full model is never held at once. A tensor of
  at least the plan's `in_place_bytes` gets a bucket of its own, which goes out straight from
  the tensor's memory when it is already in the wire dtype: no copy on either side (the
  receiver takes every bucket straight into the memory it stages it in).
- Every bucket has a checksum (`bucket_checksum`: the bucket's bytes as int64 words, summed
  with wrap-around; any change of one word changes it). The plan groups consecutive buckets into
  checksum windows (`checksum_window_bytes`, 64 MiB by default in the trainer): a window's
  checksums go in one broadcast after its last bucket, so a collective's fixed cost (~0.5 ms on
  gloo here) is paid once a window rather than once a bucket. The receiver checksums each bucket
  as it completes, hands a window's buckets out only once the window's checksums arrived and
  matched, and raises `WeightChecksumError` on a mismatch: nothing of that window is handed out
  (the publish fails and the coordinator retries it on a new epoch).
- Every collective has a per-operation timeout: gloo's `abort()` does not interrupt a
  pending wait, so a dead peer is only noticed through the timeout (notes/distributed-cpu).
  How the group is built, its NCCL error policy, the device-kind check of both ends and what
  "complete" means on NCCL (the stream is synchronized): tandem/weight_group.py.
- The receiver returns a complete staged state dict or raises: the caller swaps it in
  only once everything arrived, so a half-received update never serves a request.
"""

from __future__ import annotations

import datetime
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
import torch.distributed as dist

from tandem.stores import SealedStore, serve_store
from tandem.weight_group import EpochGroup, _split_address, broadcast, complete
from tandem.weight_plan import DEFAULT_BUCKET_BYTES, BucketPlan, GroupSpec, TensorSpec, checksum_window_ends

__all__ = ["BucketPlan", "GroupSpec", "TensorSpec", "WeightChecksumError", "WeightReceiver", "WeightSender",
           "bucket_checksum", "make_bucket_plan"]

DEFAULT_IN_PLACE_BYTES = 1 << 20
"""A tensor this large travels in a bucket of its own, from its own memory (`make_bucket_plan`)."""
DEFAULT_CHECKSUM_WINDOW_BYTES = 64 << 20
"""Buckets whose checksums travel in one broadcast (`make_bucket_plan`): at the 0.5B shape about a
layer's worth, so a streamed receive still applies layer by layer while the next ones arrive."""
_ALIGN_BYTES = 64  # keeps every tensor's byte offset a multiple of any element size


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_bucket_plan(tensors: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES, in_place_bytes: int | None = None,
                     checksum_window_bytes: int | None = None) -> BucketPlan:
    """Pack tensors in the given order into buckets of at most bucket_bytes.

    A tensor larger than bucket_bytes gets a bucket of its own, and so does one of at least
    `in_place_bytes` (None: no such rule), which the sender then broadcasts from the tensor's own
    memory when it can (`iter_buckets`), instead of copying it into a bucket buffer. Consecutive
    buckets of at least `checksum_window_bytes` together share a checksum broadcast (None: one per
    bucket; `BucketPlan.window_ends`).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    if in_place_bytes is not None and in_place_bytes <= 0:
        raise ValueError(f"in_place_bytes must be positive (or None), got {in_place_bytes}")
    specs: list[TensorSpec] = []
    sizes: list[int] = []
    offset = 0
    alone = False  # the bucket being filled holds one in-place tensor: nothing joins it
    for name, shape, dtype in tensors:
        size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        solo = in_place_bytes is not None and size >= in_place_bytes
        if not sizes or (offset > 0 and (alone or solo or offset + size > bucket_bytes)):
            if sizes:
                sizes[-1] = offset
            sizes.append(0)
            offset = 0
        specs.append(TensorSpec(name, tuple(int(s) for s in shape), dtype_name(dtype), len(sizes) - 1, offset, size))
        offset = _align(offset + size)
        alone = solo
    if sizes:
        sizes[-1] = offset
    return BucketPlan(tuple(specs), tuple(sizes), checksum_window_ends(tuple(sizes), checksum_window_bytes))


def plan_for_state_dict(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None,
                        bucket_bytes: int = DEFAULT_BUCKET_BYTES, in_place_bytes: int | None = None,
                        checksum_window_bytes: int | None = None) -> BucketPlan:
    return make_bucket_plan(((n, tuple(t.shape), dtype or t.dtype) for n, t in state.items()), bucket_bytes,
                            in_place_bytes, checksum_window_bytes)


def _align(n: int) -> int:
    return (n + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES


def _header(version: int, plan: BucketPlan, device: torch.device) -> torch.Tensor:
    return torch.tensor([version, len(plan.bucket_sizes_bytes), plan.total_bytes, plan.digest()],
                        dtype=torch.int64, device=device)


class WeightChecksumError(ConnectionError):
    """A bucket's bytes do not sum to the checksum sent with them: corrupted in flight."""


def bucket_checksum(bucket: torch.Tensor) -> torch.Tensor:
    """The bucket's bytes as int64 words, summed with wrap-around (a 1-element int64 tensor on the
    bucket's device). Any change of one word changes it (every single-bit flip, any one word
    overwritten); meant for corruption, not an adversary. Reads the bytes once: on this machine's
    CPU ~24 GiB/s on one thread, against gloo's ~4.6 GiB/s (benchmarks/publish_real_size.py).
    Bucket sizes are multiples of 64 bytes (`make_bucket_plan`), so the words cover every byte."""
    return bucket.view(torch.int64).sum().reshape(1)


class WeightSender:
    """Trainer rank 0's side: hosts the store and broadcasts buckets, double-buffered: one
    bucket fills while the previous one is on the wire (two buckets of buffer in all); a bucket
    of one tensor already in the wire dtype goes out from the tensor itself (no buffer, no copy).

    `tamper(index, bucket)`, for tests only: called on each bucket's wire bytes after its
    checksum was taken, before it is broadcast (a fault injected in flight)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, device: torch.device | None = None,
                 advertise_host: str | None = None, secret: str | None = None):
        """The store listens on host:port alone; `secret` (the run's token; receivers pass the
        same) seals it, None leaves it open to any client that reaches it (tests, benchmarks)."""
        self._server = serve_store(host, port, timeout_s=60)
        self._store = self._server if secret is None else SealedStore(self._server, secret, "weight-sync")
        self._advertise = advertise_host or host
        self._device = device or torch.device("cpu")
        self._group = EpochGroup()
        self.tamper: Callable[[int, torch.Tensor], None] | None = None

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
        buffers: list[torch.Tensor | None] = [None, None]  # made on first use: in-place buckets need none
        packed: set[int] = set()  # the buckets that took a buffer
        in_flight: deque[tuple[int, tuple[dist.Work, ...], torch.Tensor, torch.Tensor | None]] = deque()
        limit = 2 * max(plan.bucket_sizes_bytes, default=0)  # bytes on the wire at once (tensors sent in place)
        window_ends = {window.stop for window in plan.windows()}
        checksums: list[torch.Tensor] = []  # of the window being sent

        def finish_oldest() -> None:
            _, works, _, _ = in_flight.popleft()
            for work in works:
                complete(work, self._device)

        def buffer_for(index: int, size: int) -> torch.Tensor:
            slot = index % 2
            while any(i in packed and i % 2 == slot for i, *_ in in_flight):
                finish_oldest()  # the buffer is free again once its broadcast finished
            if buffers[slot] is None:
                buffers[slot] = torch.empty(send_buffer_sizes(plan)[slot], dtype=torch.uint8, device=self._device)
            packed.add(index)
            return buffers[slot][:size]

        for index, bucket in iter_buckets(plan, tensors, buffer_for, in_place_device=self._device):
            while in_flight and sum(b.numel() for _, _, b, _ in in_flight) + bucket.numel() > limit:
                finish_oldest()
            checksums.append(bucket_checksum(bucket))
            if self.tamper is not None:
                self.tamper(index, bucket)
            works = (broadcast(group, bucket, spec.op_timeout_s),)
            window_sums = None
            if index + 1 in window_ends:  # the window's checksums, after its last bucket
                window_sums = torch.cat(checksums)
                checksums.clear()
                works += (broadcast(group, window_sums, spec.op_timeout_s),)
            in_flight.append((index, works, bucket, window_sums))  # the tensors stay alive until sent
            del bucket
        while in_flight:
            finish_oldest()  # returns once every byte left: the caller's timing is the transfer's
        return plan.total_bytes

    def close(self) -> None:
        self._group.close()


def send_buffer_sizes(plan: BucketPlan) -> list[int]:
    """Bytes of the sender's two buffers: even buckets fill the first, odd ones the second (at
    most: a bucket that goes out in place takes none)."""
    sizes = plan.bucket_sizes_bytes
    return [max(sizes[slot::2]) for slot in range(min(2, len(sizes)))]


def iter_buckets(plan: BucketPlan, tensors: Iterable[tuple[str, torch.Tensor]],
                 buffer_for: Callable[[int, int], torch.Tensor],
                 in_place_device: torch.device | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Pack `tensors` into the plan's buckets as they come; yield (index, bucket bytes) as each fills.

    `tensors` must come in plan order, full and one at a time (a generator that gathers each
    one is the point): each is packed, in the plan's dtype, as soon as it arrives and dropped,
    so what is held is the bucket being filled plus one tensor, never the whole model.
    `buffer_for(index, size)` hands out the bytes bucket `index` is packed into. With
    `in_place_device`, a bucket that is one tensor in the plan's dtype on that device is yielded
    as the tensor's own bytes, and with `plan.in_block` a bucket whose tensors all lie at their
    plan offsets of one `plan_block_views` block as that block's bytes (no buffer, no copy).

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
        buffer = None
        block = None  # the bucket's bytes over memory every tensor so far lies in, at its plan offset
        held: list[tuple[TensorSpec, torch.Tensor]] = []  # those tensors: packed after all if one does not
        while position < len(specs) and specs[position].bucket_index == index:
            item = next(source, None)
            if item is None:
                raise ValueError(f"the weights ended after {position} of the bucket plan's {len(specs)} tensors: "
                                 f"{specs[position].name!r} and every later one are missing")
            name, tensor = item
            del item
            spec = specs[position]
            _check_against_plan(spec, position, positions, name, tensor)
            position += 1
            if buffer is None and in_place_device is not None:
                block = _in_block(block, spec, size, tensor, in_place_device, plan.in_block)
                if block is not None:
                    held.append((spec, tensor.detach()))
                    del tensor  # the held view is all that stays (`HeldBytes` counts tensors, not storage)
                    continue
                buffer = buffer_for(index, size)
                for held_spec, held_tensor in held:
                    _pack(buffer, held_spec, held_tensor)
                held.clear()
            if buffer is None:
                buffer = buffer_for(index, size)
            _pack(buffer, spec, tensor)
            del tensor  # the next tensor is made after this one is gone
        if buffer is None:  # the block's own bytes (no buffer, no copy), or a bucket without tensors
            buffer = block if block is not None else buffer_for(index, size)
        del block, held
        if index == len(plan.bucket_sizes_bytes) - 1:
            _check_exhausted(source, len(specs))
        yield index, buffer
        del buffer  # the caller is done with it: not held while the next one fills
    if not plan.bucket_sizes_bytes:
        _check_exhausted(source, 0)


def _in_block(block: torch.Tensor | None, spec: TensorSpec, bucket_size: int, tensor: torch.Tensor,
              device: torch.device, several: bool) -> torch.Tensor | None:
    """The bucket's bytes over memory the tensors already hold, with `tensor` added, or None when
    it cannot be broadcast from there: every tensor of it so far (`block`: those bytes) in the
    plan's dtype, contiguous, on the sender's device, at its plan offset from one 8-byte-aligned
    start, in one storage that holds the whole bucket. A bucket of one tensor is that tensor's
    own bytes; a bucket of `several` only where the plan says the tensors lie in a block
    (`BucketPlan.in_block`: a trainer's parameters, `TrainerBackend.keep_published_in`): a
    gathered tensor may be a view of a larger buffer, and holding it while the next one is
    gathered would hold two."""
    if not (tensor.dtype == getattr(torch, spec.dtype) and tensor.device == device and tensor.is_contiguous()):
        return None
    start = tensor.data_ptr() - spec.offset_bytes
    storage = tensor.untyped_storage()
    if block is not None:
        same = block.data_ptr() == start and block.untyped_storage().data_ptr() == storage.data_ptr()
        return block if same else None
    if spec.offset_bytes == 0 and spec.size_bytes == bucket_size:
        return tensor.detach().reshape(-1).view(torch.uint8) if start % 8 == 0 else None
    if not several:
        return None
    offset = start - storage.data_ptr()
    if start % 8 or offset < 0 or offset + bucket_size > storage.nbytes():
        return None
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, offset, (bucket_size,))


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
    """One pass: the cast (if any) and the copy into the bucket happen in the same copy_."""
    dst = buffer[spec.offset_bytes:spec.offset_bytes + spec.size_bytes].view(getattr(torch, spec.dtype))
    dst.view(tensor.shape).copy_(tensor.detach())


class WeightReceiver:
    """A generator's side: joins the epoch's group and receives one version.

    On CPU each bucket arrives straight into the memory it is staged in (the staged tensors are
    views of it: no copy). With a `stage_device` other than `device` (a generator on a GPU) the
    device's extra memory is two buckets whatever the model's size: buckets arrive into two
    buffers on `device` (the next one posted while the last one is copied out) and each bucket
    is copied to `stage_device` (pinned host memory, outside vLLM's device budget) as it
    completes; vLLM's loaders copy each tensor onto the device as they take it, as when they
    load a checkpoint. Either way a bucket is handed out only once the checksums of its window
    arrived and matched.
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
        """Receive every bucket of `version`; returns the full staged state dict or raises
        (`WeightChecksumError` when a bucket arrived corrupted)."""
        return dict(self.iter_receive(spec, rank, version, plan))

    def iter_receive(self, spec: GroupSpec, rank: int, version: int, plan: BucketPlan,
                     ahead: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """`version`'s tensors (HF name, tensor) bucket by bucket, each bucket only once its checksum
        window arrived whole and matched; raises on any failure (`WeightChecksumError`: a corrupted
        bucket), and the group is dropped then, or when the caller stops early.

        On CPU the tensors are views of memory of their own bucket, posted through the checksum
        window after the one handed out and `ahead` buckets past it (None: every bucket at once);
        with `ahead`, memory the caller has let go of is all that stays, so a caller that applies
        each tensor and drops it holds about two windows and `ahead` buckets at a time."""
        completed = False
        try:
            yield from self._iter_receive(spec, rank, version, plan, ahead)
            completed = True
        finally:
            if not completed:  # an error, or a caller that gave up: never reuse the group
                self._group.close(failed=True)

    def _iter_receive(self, spec: GroupSpec, rank: int, version: int, plan: BucketPlan,
                      ahead: int | None) -> Iterator[tuple[str, torch.Tensor]]:
        if not 1 <= rank < spec.world_size:
            raise ValueError(f"receivers take ranks 1..world_size-1 ({spec.world_size - 1}), got {rank}")
        group = self._group.get(self._store_for(spec), spec, rank, self._device)
        header = torch.zeros(4, dtype=torch.int64, device=self._device)
        complete(broadcast(group, header, spec.op_timeout_s), self._device)
        expected = _header(version, plan, self._device)
        if not torch.equal(header, expected):
            raise ConnectionError(f"weight-sync header {header.tolist()} does not match the announced "
                                  f"{expected.tolist()} (version, buckets, bytes, plan digest)")
        in_place = self._stage_device == self._device
        if in_place:  # each bucket arrives in memory of its own, which the staged tensors are views of
            into, keep = (lambda index, size: torch.empty(size, dtype=torch.uint8, device=self._device)), None
        else:  # two reused buffers on the device: each bucket copied out, whole, to pinned host memory
            into, keep = None, lambda index, bucket: torch.empty(bucket.shape, dtype=torch.uint8,
                                                                 device=self._stage_device,
                                                                 pin_memory=True).copy_(bucket)
        for _, bucket, tensors in receive_buckets(group, plan, self._device, spec.op_timeout_s, into=into, keep=keep,
                                                  version=version, ahead=ahead if in_place else None):
            views = [(t.name, bucket[t.offset_bytes:t.offset_bytes + t.size_bytes].view(getattr(torch, t.dtype))
                      .view(t.shape)) for t in tensors]  # views into the bucket, which they keep alive
            del bucket
            while views:
                yield views.pop(0)

    def close(self) -> None:
        self._group.close()


_CHECKSUMS = -1
"""In `receive_buckets`' wire order, a window's checksum broadcast (in place of a bucket index)."""


def receive_buckets(group: dist.ProcessGroup, plan: BucketPlan, device: torch.device, timeout_s: float,
                    into: Callable[[int, int], torch.Tensor] | None = None,
                    keep: Callable[[int, torch.Tensor], torch.Tensor] | None = None, version: int | None = None,
                    ahead: int | None = None) -> Iterator[tuple[int, torch.Tensor, list[TensorSpec]]]:
    """Receive the plan's buckets, window by window (`BucketPlan.windows`); yield (index, the
    bucket's bytes, the specs of its tensors) for each bucket of a window once all of them arrived
    and their checksums match the window's (else raise `WeightChecksumError`; `version` only names
    the version in its message). While the caller handles a window, later buckets are posted.

    `into(index, size)` gives the memory bucket `index` arrives in (the caller keeps it), and
    while a window is handed out the next one is posted whole, and `ahead` buckets past it (None:
    every bucket at once, so the sender never waits for a receive to be posted). None: two reused buffers on
    `device`, one bucket posted ahead, and `keep` is then required. `keep(index, bytes)` runs as
    each bucket completes, before its memory can be refilled; what it returns (a copy, where the
    buffers are reused) is what is handed out. Either way a bucket is checksummed where it landed."""
    by_bucket: dict[int, list[TensorSpec]] = {}
    for t in plan.tensors:
        by_bucket.setdefault(t.bucket_index, []).append(t)
    sizes = plan.bucket_sizes_bytes
    own = into is not None
    if not own:
        if keep is None:
            raise ValueError("receiving into two reused buffers needs `keep`: a bucket's bytes are refilled two "
                             "buckets later, before its window is handed out")
        buffers = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(min(2, len(sizes)))]
        into = lambda index, size: buffers[index % 2][:size]
    keep = keep or (lambda index, bucket: bucket)
    windows = plan.windows()
    # the broadcasts in the sender's order, as (window, bucket): each window's buckets, then its checksums
    wire = [(w, i) for w, window in enumerate(windows) for i in (*window, _CHECKSUMS)]
    posted: dict[tuple[int, int], tuple[torch.Tensor, dist.Work]] = {}
    next_op = 0

    def post_through(bucket_limit: int) -> None:
        """Post, in wire order, every broadcast before bucket `bucket_limit`."""
        nonlocal next_op
        while next_op < len(wire) and (wire[next_op][1] == _CHECKSUMS or wire[next_op][1] < bucket_limit):
            w, i = wire[next_op]
            tensor = (torch.zeros(len(windows[w]), dtype=torch.int64, device=device) if i == _CHECKSUMS
                      else into(i, sizes[i]))
            posted[wire[next_op]] = (tensor, broadcast(group, tensor, timeout_s))
            next_op += 1

    ahead = len(sizes) if ahead is None else max(1, ahead)  # with memory of its own per bucket
    if not own:
        post_through(1)  # the first bucket; each next one once the one before it arrived
    for w, window in enumerate(windows):
        if own:  # the next window whole as well, so the wire fills it while the caller applies this one
            post_through((windows[w + 1] if w + 1 < len(windows) else window).stop + ahead)
        kept: list[torch.Tensor] = []
        sums: list[torch.Tensor] = []
        for index in window:
            bucket, work = posted.pop((w, index))
            complete(work, device)  # the bytes are in the buffer, not merely enqueued (NCCL)
            if not own:
                post_through(index + 2)  # the next bucket, into the other buffer, while this one is checked
            sums.append(bucket_checksum(bucket))
            kept.append(keep(index, bucket))
            del bucket
        expected, work = posted.pop((w, _CHECKSUMS))
        complete(work, device)
        _check_window(window, torch.cat(sums), expected, sizes, version)
        for index, bucket in zip(window, kept):
            yield index, bucket, by_bucket.get(index, [])
        del kept


def _check_window(window: range, got: torch.Tensor, expected: torch.Tensor, sizes: tuple[int, ...],
                  version: int | None) -> None:
    """Raise WeightChecksumError, naming the first bad bucket, unless the checksums of `window`'s
    buckets as they arrived (`got`) are the sender's (`expected`)."""
    if torch.equal(got, expected):
        return
    bad = int((got != expected).nonzero()[0, 0])
    index = window.start + bad
    named = "" if version is None else f" of weight version {version}"
    raise WeightChecksumError(
        f"bucket {index} of {len(sizes)}{named} ({sizes[index]} bytes) arrived corrupted: its bytes sum to "
        f"{int(got[bad].item())}, the sender's checksum is {int(expected[bad].item())}; nothing of its checksum "
        "window or later ones is handed out, and the publish fails")


def iter_plan_tensors(plan: BucketPlan, state: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `state` in plan order (what WeightSender.send expects)."""
    for spec in plan.tensors:
        yield spec.name, state[spec.name]


def plan_block_views(plan: BucketPlan, device: torch.device | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One block of memory laid out as `plan`'s buckets end to end, and a view of it for each of
    the plan's tensors (its dtype and shape, at its bucket offset; contents uninitialised). Tensors
    that live in these views go out from the block itself, every bucket without a copy, under the
    plan marked `in_block` (`iter_buckets`)."""
    block = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device)
    starts = [0]
    for size in plan.bucket_sizes_bytes:
        starts.append(starts[-1] + size)
    views = {}
    for spec in plan.tensors:
        begin = starts[spec.bucket_index] + spec.offset_bytes
        views[spec.name] = block[begin:begin + spec.size_bytes].view(getattr(torch, spec.dtype)).view(spec.shape)
    return block, views
