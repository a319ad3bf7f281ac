"""How a weight version's bytes reach the generators: one interface, three transports, one of
which the loop picks once per run from its colocation (tandem.colocation):

    CollectiveTransport     trainer rank 0 broadcasts the bucket plan's buckets over a
                            weight-sync group (dedicated generators; gloo on CPU, NCCL on GPUs)
    SharedMemoryTransport   the trainer writes the version as HF safetensors into a fresh
                            directory on the host's shared memory; generators map it (colocated, CPU)
    CudaIpcTransport        the trainer exports CUDA IPC handles of its buckets; generators read
                            them in place (colocated, GPUs)

Each sends to a list of live generators and raises the first generator's (or the trainer's)
`RpcFailure` once every side has answered; the publisher (publisher.py) retries, checks health
and keeps versions. Generators that share the trainer's weights (the trainer serving generation
from its own Megatron model) need no bytes: the collective transport leaves them out of the group
(a group of the trainer alone makes the version theirs); the config refuses them with colocation.

Weight-sync groups: a membership change starts a new epoch, a new group under a new PrefixStore
with a fresh admission secret; `reset` after a failure makes the next send form a new one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from coordinator.membership.services import GeneratorHandle
from tandem.colocation import WeightTransport as TransportKind
from tandem.weight_plan import BucketPlan, GroupSpec
from tandem.weight_source import CollectiveSource, CudaIpcSource, SharedMemorySource, WeightSource


@dataclass(frozen=True)
class PublishReport:
    version: int
    epoch: int
    """The weight-sync group's epoch (-1 for transports without a group)."""
    num_generators: int
    bytes_sent: int
    duration_s: float
    attempts: int = 1


class WeightTransport(Protocol):
    def send(self, generators: Sequence[GeneratorHandle], version: int) -> PublishReport:
        """Make `generators` serve the trainer's weights as `version`: its current ones, or the
        copy it holds of that version (async GRPO, the collective transport: the trainer sends it
        beside its next train step)."""

    def reset(self) -> None:
        """Forget state a failed send may have spoiled (a group): the next send starts afresh."""

    @property
    def epoch(self) -> int:
        """The epoch of the last weight-sync group formed (-1: none)."""


def build_transport(kind: TransportKind, trainer, plan: BucketPlan, store_address: str, log, *,
                    op_timeout_s: float) -> WeightTransport:
    """The run's transport, chosen once from the colocation's kind."""
    if kind is TransportKind.GROUP:
        return CollectiveTransport(trainer, store_address, plan, log, op_timeout_s=op_timeout_s)
    if kind is TransportKind.SHARED_MEMORY:
        return SharedMemoryTransport(trainer, shared_memory_dir(), log, op_timeout_s=op_timeout_s)
    return CudaIpcTransport(trainer, plan, log, op_timeout_s=op_timeout_s)


def _load_all(generators: Sequence[GeneratorHandle], source_for: Callable[[int], WeightSource], version: int,
              timeout_s: float, trainer_side: Callable[[], object] | None = None) -> object:
    """Run the trainer's side (if any) and every generator's load_weights concurrently; wait for
    all of them (a receiver stuck in a failed epoch would hold up the next one), then raise the
    first failure or return the trainer side's result."""
    with ThreadPoolExecutor(1 + len(generators)) as pool:
        sent: Future | None = pool.submit(trainer_side) if trainer_side is not None else None
        loads = [pool.submit(g.client.load_weights, source_for(i), version, timeout_s)
                 for i, g in enumerate(generators)]
        outcomes = [f.exception() for f in [*([sent] if sent else []), *loads]]
    failure = next((e for e in outcomes if e is not None), None)
    if failure is not None:
        raise failure
    return sent.result() if sent is not None else None


class CollectiveTransport:
    def __init__(self, trainer, store_address: str, plan: BucketPlan, log, *, op_timeout_s: float):
        self._trainer, self._store_address, self._plan, self._log = trainer, store_address, plan, log
        self._op_timeout_s = op_timeout_s
        self._epoch = -1
        self._members: tuple[str, ...] | None = None  # the first send forms epoch 0, receivers or not
        self._secret = ""

    @property
    def epoch(self) -> int:
        return self._epoch

    def reset(self) -> None:
        self._members = None  # never reuse a group that failed: the next send forms a new epoch

    def _group_for(self, member_ids: tuple[str, ...]) -> GroupSpec:
        if member_ids != self._members:
            self._epoch += 1
            self._members = member_ids
            self._secret = secrets.token_hex(8)
            self._log.info("weight_sync_epoch", epoch=self._epoch, generators=list(member_ids))
        return GroupSpec(self._store_address, self._epoch, self._secret, 1 + len(member_ids), self._op_timeout_s)

    def send(self, generators: Sequence[GeneratorHandle], version: int) -> PublishReport:
        receivers = [g for g in generators if not g.shares_trainer_weights]
        group = self._group_for(tuple(g.member_id for g in receivers))
        timeout_s = self._op_timeout_s * (2 + len(self._plan.bucket_sizes_bytes))
        start = time.perf_counter()
        result = _load_all(receivers, lambda i: CollectiveSource(group, i + 1, self._plan), version, timeout_s,
                           trainer_side=lambda: self._trainer.publish_weights(group, version))
        duration = time.perf_counter() - start
        self._log.info("weights_published", version=version, epoch=group.epoch, generators=len(generators),
                       bytes=result.bytes_sent, seconds=round(duration, 3))
        return PublishReport(version, group.epoch, len(generators), result.bytes_sent, duration)


class SharedMemoryTransport:
    def __init__(self, trainer, directory: Path, log, *, op_timeout_s: float):
        self._trainer, self._directory, self._log = trainer, directory, log
        self._timeout_s = op_timeout_s * 10
        self.epoch = -1

    def reset(self) -> None:
        pass  # every send writes a fresh directory

    def send(self, generators: Sequence[GeneratorHandle], version: int) -> PublishReport:
        directory = self._directory / f"v{version}-{secrets.token_hex(4)}"
        start = time.perf_counter()
        try:
            # trainer rank 0 writes into the host's shared memory, in the dtype the generators serve
            self._trainer.export_hf(str(directory), for_generators=True)
            num_bytes = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
            _load_all(generators, lambda i: SharedMemorySource(str(directory)), version, self._timeout_s)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        duration = time.perf_counter() - start
        self._log.info("weights_published", version=version, shared_memory=True, generators=len(generators),
                       bytes=num_bytes, seconds=round(duration, 3))
        return PublishReport(version, -1, len(generators), num_bytes, duration)


class CudaIpcTransport:
    """The trainer frees the buckets once all generators have answered, whether they succeeded
    or not (torch's IPC reference counts keep a block from reuse while a generator that gave up
    late still holds it)."""

    def __init__(self, trainer, plan: BucketPlan, log, *, op_timeout_s: float):
        self._trainer, self._plan, self._log = trainer, plan, log
        self._timeout_s = op_timeout_s * 10
        self.epoch = -1
        self.before_load: Callable[[], None] = lambda: None
        """Called between the trainer's export and the generators' loads (loop/weights/phases.py
        wakes sleeping generators' weights there, once the trainer has emptied its cache)."""

    def reset(self) -> None:
        pass  # every send exports afresh

    def send(self, generators: Sequence[GeneratorHandle], version: int) -> PublishReport:
        start = time.perf_counter()
        export = self._trainer.export_cuda_ipc(version)
        try:
            self.before_load()
            _load_all(generators, lambda i: CudaIpcSource(export.buckets, self._plan), version, self._timeout_s)
        finally:
            self._trainer.release_cuda_ipc(version)
        duration = time.perf_counter() - start
        self._log.info("weights_published", version=version, cuda_ipc=True, generators=len(generators),
                       bytes=export.num_bytes, seconds=round(duration, 3))
        return PublishReport(version, -1, len(generators), export.num_bytes, duration)


def shared_memory_dir() -> Path:
    """This user's directory on the host's shared memory (/dev/shm, else the temp dir), mode 0700."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    path = base / f"tandem-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path
