"""Publishing a weight version: every trainer rank streams its part of the HF tensors
(`TrainerBackend.iter_published_tensors`: TP gathers, pipeline sends, `full_tensor()`; with LoRA's
adapter weight sync the adapters alone), and rank 0
packs each tensor into the bucket plan's current bucket as it arrives and broadcasts the
bucket to the generators (`WeightSender.send`). Rank 0 holds two buckets (one filling, one on
the wire) and one gathered tensor, never the whole model.

Lockstep: the gathers are collectives over the trainer's own groups, so rank 0 must take part
in all of them even when its broadcast fails part-way (a dead generator, a tensor the plan
does not expect): it then drains the export without sending and raises afterwards, and the
other ranks finish the command as usual. The receivers are never left with a complete
transfer: the sender closes the group under them (see `tandem.weight_sync.iter_buckets`).

Detached publishes (async GRPO, `DetachedPublishes`): every rank runs the export's gathers while
rank 0 keeps a copy of the version (`hold`, a lockstep command: HoldWeights), the command
returns, and rank 0 broadcasts the copy from a thread of its own (`send_held`, on a PublishWeights
of that version; no lockstep, so it starts while the trainer runs its next train step). The copy
is kept until a newer version is held or published, so a retry of the same version resends it:
the weights the generators get are the ones the version names, not those the trainer has moved
on to. Rank 0 holds one copy of the model in memory meanwhile.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from tandem.weight_sync import BucketPlan, GroupSpec, WeightSender, make_bucket_plan, plan_block_views
from trainer_svc.config import TrainerSettings
from trainer_svc.interfaces import TrainerBackend


def weight_sync_plan(settings: TrainerSettings, backend: TrainerBackend) -> BucketPlan:
    """The bucket plan of every publish (broadcast, held copy, CUDA IPC), made once at start: the
    backend's HF tensors in the dtype the generators serve (`weight_sync_dtype`, which the
    coordinator sets to the dtype it gives them; auto: the checkpoint's). Each tensor is cast to
    it as it is packed (tandem.weight_sync.iter_buckets), whatever dtype it trains in.

    Where the backend can keep the published parameters in one block laid out as the plan
    (`keep_published_in`: one rank, training in the generators' dtype), it does, and the plan packs
    them into buckets of `weight_sync_bucket_bytes`, each sent from the parameters' memory: at
    Qwen2.5-0.5B's shape 25 broadcasts instead of 194, the wire at 76-88% of a raw broadcast's
    bandwidth against 66-75% (benchmarks/results/2026-12-02-parameter-block.md). Else tensors of
    `weight_sync_in_place_bytes` go alone, from their own memory, and the rest is packed."""
    dtype = (backend.checkpoint_dtype if settings.weight_sync_dtype == "auto"
             else getattr(torch, settings.weight_sync_dtype))
    shapes = [(name, shape, dtype) for name, shape in backend.published_tensor_shapes.items()]
    window = settings.weight_sync_checksum_window_bytes
    block = dataclasses.replace(make_bucket_plan(shapes, settings.weight_sync_bucket_bytes, None, window),
                                in_block=True)
    if backend.keep_published_in(block):
        return block
    return make_bucket_plan(shapes, settings.weight_sync_bucket_bytes, settings.weight_sync_in_place_bytes, window)


def plan_dtype(plan: BucketPlan) -> torch.dtype:
    """The one dtype `weight_sync_plan` gave every tensor: the generators'."""
    (dtype,) = {spec.dtype for spec in plan.tensors}
    return getattr(torch, dtype)


def publish_weights(tensors: Iterable[tuple[str, torch.Tensor]], sender: WeightSender | None, group: GroupSpec,
                    version: int, plan: BucketPlan) -> int:
    """Collective (every rank, same order): broadcast `tensors` as `version` from rank 0 (the one
    with a `sender`); returns the bytes sent (0 on other ranks).

    Raises ValueError when the tensors do not match the plan and ConnectionError when the
    weight-sync group fails; an error of the export itself propagates unchanged.
    """
    export_failed: list[BaseException] = []
    watched = _watch(tensors, export_failed)
    try:
        if sender is None:
            return 0
        try:
            return sender.send(group, version, plan, watched)
        except RuntimeError as exc:  # gloo/NCCL timeouts and dead peers: the group is unreachable
            if export_failed:
                raise
            raise ConnectionError(f"weight broadcast to epoch {group.epoch} failed: {exc}") from exc
    finally:
        for _ in watched:  # the other ranks' gathers wait for this rank's part in them
            pass


def _watch(tensors: Iterable[tuple[str, torch.Tensor]],
           failed: list[BaseException]) -> Iterator[tuple[str, torch.Tensor]]:
    """`tensors`, noting in `failed` an exception raised by the export itself."""
    try:
        yield from tensors
    except BaseException as exc:
        failed.append(exc)
        raise


@dataclass
class _Held:
    version: int
    tensors: list[tuple[str, torch.Tensor]]  # rank 0's copy (empty on the other ranks)


class DetachedPublishes:
    """One detached broadcast at a time on rank 0; the last version's copy held for resends.
    `hold` runs on the trainer's engine thread, `send_held` on a call's own thread."""

    def __init__(self, log):
        self._log = log
        self._held: _Held | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # around _held and _thread

    def holds(self, version: int) -> bool:
        held = self._held
        return held is not None and held.version == version

    def hold(self, tensors: Iterable[tuple[str, torch.Tensor]], version: int, plan: BucketPlan) -> None:
        """Collective (every rank): copy `version` (rank 0 keeps it; the gathers run everywhere),
        after the broadcast in flight, if any, has finished. The copy is one block laid out as
        `plan`, in its dtype (the generators'), so every bucket of a send goes from it, no copy."""
        self.wait()
        copy: list[tuple[str, torch.Tensor]] = []
        views: dict[str, torch.Tensor] | None = None
        for name, tensor in tensors:  # nothing on ranks > 0
            if views is None:
                _, views = plan_block_views(plan, tensor.device)
            if name not in views:
                raise ValueError(f"tensor {name!r} is not in the bucket plan of weight version {version}")
            copy.append((name, views[name].copy_(tensor.detach())))
        held = _Held(version, copy)
        with self._lock:
            self._held = held

    def send_held(self, sender: WeightSender, group: GroupSpec, version: int, plan: BucketPlan) -> int:
        """Rank 0: broadcast the held copy of `version` from a thread (after the one in flight);
        returns the bytes it will send. LookupError when that version is not held."""
        self.wait()
        with self._lock:
            held = self._held
            if held is None or held.version != version:
                raise LookupError(f"weight version {version} is not held (held: "
                                  f"{None if held is None else held.version})")
            self._thread = threading.Thread(target=self._send, args=(held, sender, group, plan), daemon=True,
                                            name=f"publish-v{version}")
            self._thread.start()
        return plan.total_bytes

    def start(self, tensors: Iterable[tuple[str, torch.Tensor]], sender: WeightSender | None, group: GroupSpec,
              version: int, plan: BucketPlan) -> int:
        """Collective (every rank): `hold` unless the version is held already, then `send_held`
        from rank 0. Returns the bytes it will send (0 on other ranks)."""
        if not self.holds(version):
            self.hold(tensors, version, plan)
        return 0 if sender is None else self.send_held(sender, group, version, plan)

    def _send(self, held: _Held, sender: WeightSender, group: GroupSpec, plan: BucketPlan) -> None:
        started = time.perf_counter()
        try:
            # the held copy is a block laid out as the plan (`hold`): every bucket goes from it
            sent = publish_weights(iter(held.tensors), sender, group, held.version,
                                   dataclasses.replace(plan, in_block=True))
            self._log.info("weights_broadcast_detached", version=held.version, epoch=group.epoch, bytes=sent,
                           seconds=round(time.perf_counter() - started, 3))
        except Exception as exc:  # the generators' receive fails too: the coordinator retries (a resend)
            self._log.warning("weights_broadcast_detached_failed", version=held.version, epoch=group.epoch,
                              error=f"{type(exc).__name__}: {exc}")

    def wait(self) -> None:
        """Let the broadcast in flight (if any) finish; a command that touches the group waits for it."""
        thread = self._thread
        if thread is not None:
            thread.join()
            with self._lock:
                if self._thread is thread:
                    self._thread = None

    def forget(self) -> None:
        """A non-detached publish moved the generators past the held copy: drop it."""
        self.wait()
        with self._lock:
            self._held = None
