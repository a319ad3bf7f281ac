"""Weight versions and publishing: the trainer broadcasts version v+1 to every live
generator over a weight-sync group; a membership change starts a new epoch (a new group
under a new PrefixStore and a fresh admission secret).

Failures. Before a publish every receiver is health-checked (GetInfo with a short
deadline), so a generator already dead costs nothing. A publish that fails part-way (a
receiver died during the broadcast: the trainer notices through gloo's per-operation
timeout or a reset connection) is retried on a new epoch with the receivers that still
answer; the dead are reported through `on_dead` (the registry drops them). At most
`max_attempts` attempts, then `PublishError` naming each attempt's failure.

Colocated mode (`shared_dir` set): the trainer writes each version as HF safetensors into a
fresh directory on the host's shared memory (tmpfs) and every generator loads it from there
(GeneratorClient.load_shared_weights) with the same atomic swap; no group is formed, the
directory is removed after the publish. Retries, health checks and admission are the same.
Colocated on GPUs (`cuda_ipc`): the same, through CUDA IPC handles of the trainer's buckets
(coordinator/weights_ipc.py).

Generators that share the trainer's weights (`GeneratorHandle.shares_trainer_weights`: the
trainer serves generation from its own model, policy.generation.backend: megatron) receive
nothing: they are left out of the group, and the trainer's publish to the others (to a group
of the trainer alone when there are none) makes the version theirs. They fail and recover
with the trainer. The config refuses them in colocated mode.

Admission. Generators swap atomically (generator_svc), so none serves a half-received
version; but one that missed a version (it joined late, or a publish to it failed) serves
old weights. `admit` keeps such a generator out of the rollout until it serves the
publisher's version, bringing it up to date first (a publish of the current version to a
group of just the stale ones) when the trainer still holds exactly that version.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from coordinator.weights_ipc import publish_cuda_ipc
from tandem.weight_sync import BucketPlan, GroupSpec

# Errors that say something about the request itself: a retry on a new epoch cannot help.
_FATAL_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED}


class PublishError(RuntimeError):
    """A publish failed on every attempt, or nothing is left to publish to."""


@dataclass(frozen=True)
class PublishReport:
    version: int
    epoch: int
    num_generators: int
    bytes_sent: int
    duration_s: float
    attempts: int = 1


class WeightPublisher:
    def __init__(self, trainer, store_address: str, plan: BucketPlan, log, *, op_timeout_s: float = 30.0,
                 version: int = 0, max_attempts: int = 3, health_timeout_s: float = 5.0,
                 on_dead: Callable[[object, Exception], None] | None = None, shared_dir: Path | None = None,
                 cuda_ipc: bool = False):
        self._trainer = trainer
        self._store_address = store_address
        self._plan = plan
        self._log = log
        self._op_timeout_s = op_timeout_s
        self._max_attempts = max_attempts
        self._health_timeout_s = health_timeout_s
        self._on_dead = on_dead
        self._shared_dir = shared_dir
        self._cuda_ipc = cuda_ipc
        self.version = version
        self._epoch = -1
        self._members: tuple[str, ...] = ()
        self._secret = ""
        self._current: set[str] = set()  # members that acknowledged self.version
        self._trainer_step: int | None = None  # the trainer's global step when self.version was sent

    @property
    def epoch(self) -> int:
        """The epoch of the last group formed (-1 before the first publish)."""
        return self._epoch

    def is_current(self, member_id: str) -> bool:
        """Whether the generator serves the publisher's version (version 0: every generator
        loads the trainer's initial checkpoint from disk)."""
        return self.version == 0 or member_id in self._current

    def _group_for(self, member_ids: tuple[str, ...]) -> GroupSpec:
        if member_ids != self._members:
            self._epoch += 1
            self._members = member_ids
            self._secret = secrets.token_hex(8)
            self._log.info("weight_sync_epoch", epoch=self._epoch, generators=list(member_ids))
        return GroupSpec(self._store_address, self._epoch, self._secret, 1 + len(member_ids), self._op_timeout_s)

    def publish(self, generators: Sequence, *, version: int | None = None) -> PublishReport:
        """Broadcast the trainer's weights to `generators` (GeneratorHandle list) as
        `version` (default: version+1). An explicit version re-labels nothing new: resume
        uses it to send the restored weights under the version the checkpoint holds."""
        target = self.version + 1 if version is None else version
        if target < self.version:
            raise ValueError(f"version {target} is older than the published version {self.version}")
        report, acked = self._publish_with_retries(list(generators), target)
        self.version = target
        self._current = acked
        self._trainer_step = self._trainer.info().global_step
        return report

    def admit(self, generators: Sequence) -> list:
        """The generators that serve the current version; stale ones are brought up to
        date first when that is safe (the trainer has not stepped since the last publish)."""
        stale = [g for g in generators if not self.is_current(g.member_id)]
        if stale and self._trainer_step is not None and self._trainer.info().global_step == self._trainer_step:
            self._log.info("weights_catch_up", version=self.version, generators=[g.member_id for g in stale])
            try:
                _, acked = self._publish_with_retries(stale, self.version)
                self._current |= acked
            except PublishError as exc:
                self._log.warning("weights_catch_up_failed", error=str(exc))
        elif stale:
            self._log.info("generators_not_admitted", version=self.version, generators=[g.member_id for g in stale])
        return [g for g in generators if self.is_current(g.member_id)]

    def _publish_with_retries(self, generators: list, version: int) -> tuple[PublishReport, set[str]]:
        errors: list[str] = []
        live = self._healthy(generators)
        for attempt in range(1, self._max_attempts + 1):
            if not live:
                raise PublishError(f"no live generator to publish version {version} to"
                                   + (f"; earlier attempts: {'; '.join(errors)}" if errors else ""))
            started = time.perf_counter()
            try:
                report = self._attempt(live, version)
            except grpc.RpcError as exc:
                if exc.code() in _FATAL_CODES:
                    raise
                self._members = ()  # never reuse a group that failed: the retry forms a new epoch
                seconds = time.perf_counter() - started
                errors.append(f"attempt {attempt} (epoch {self._epoch}, {seconds:.1f}s): "
                              f"{exc.code().name}: {exc.details()}")
                self._log.warning("publish_failed", version=version, epoch=self._epoch, attempt=attempt,
                                  seconds=round(seconds, 3), code=exc.code().name, error=exc.details())
                self._check_trainer(errors)
                live = self._healthy(live)
                continue
            return PublishReport(report.version, report.epoch, report.num_generators, report.bytes_sent,
                                 report.duration_s, attempt), {g.member_id for g in live}
        raise PublishError(f"publishing weight version {version} failed {self._max_attempts} times: "
                           + "; ".join(errors))

    def _attempt(self, generators: list, version: int) -> PublishReport:
        if self._cuda_ipc:
            num_bytes, seconds = publish_cuda_ipc(self._trainer, generators, version, self._plan,
                                                  self._op_timeout_s * 10, self._log)
            return PublishReport(version, self._epoch, len(generators), num_bytes, seconds)
        if self._shared_dir is not None:
            return self._attempt_shared(generators, version, self._shared_dir)
        receivers = [g for g in generators if not g.shares_trainer_weights]
        group = self._group_for(tuple(g.member_id for g in receivers))
        start = time.perf_counter()
        timeout_s = self._op_timeout_s * (2 + len(self._plan.bucket_sizes_bytes))
        with ThreadPoolExecutor(1 + len(receivers)) as pool:
            sent = pool.submit(self._trainer.publish_weights, group, version)
            received = [pool.submit(g.client.receive_weights, group, rank, version, self._plan, timeout_s)
                        for rank, g in enumerate(receivers, start=1)]
            # Wait for every side, not only the first failure: a receiver still stuck in the
            # failed epoch would otherwise hold up the next one.
            outcomes = [f.exception() for f in [sent, *received]]
        failure = next((e for e in outcomes if e is not None), None)
        if failure is not None:
            raise failure
        report = sent.result()
        duration = time.perf_counter() - start
        self._log.info("weights_published", version=version, epoch=group.epoch, generators=len(generators),
                       bytes=report.bytes_sent, seconds=round(duration, 3))
        return PublishReport(version, group.epoch, len(generators), report.bytes_sent, duration)

    def _attempt_shared(self, generators: list, version: int, shared_dir: Path) -> PublishReport:
        directory = shared_dir / f"v{version}-{secrets.token_hex(4)}"
        start = time.perf_counter()
        try:
            self._trainer.export_hf(str(directory))  # trainer rank 0 writes into the host's shared memory
            num_bytes = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
            timeout_s = self._op_timeout_s * 10
            with ThreadPoolExecutor(len(generators)) as pool:
                loads = [pool.submit(g.client.load_shared_weights, str(directory), version, timeout_s)
                         for g in generators]
                failure = next((e for e in [f.exception() for f in loads] if e is not None), None)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if failure is not None:
            raise failure
        duration = time.perf_counter() - start
        self._log.info("weights_published", version=version, shared_memory=True, generators=len(generators),
                       bytes=num_bytes, seconds=round(duration, 3))
        return PublishReport(version, self._epoch, len(generators), num_bytes, duration)

    def _check_trainer(self, errors: list[str]) -> None:
        try:
            self._trainer.info()
        except grpc.RpcError as exc:
            raise PublishError(f"the trainer does not answer ({exc.code().name}); no retry can help: "
                               + "; ".join(errors)) from exc

    def _healthy(self, generators: list) -> list:
        """The generators that answer GetInfo; the others are reported through on_dead."""
        if not generators:
            return []

        def probe(g) -> Exception | None:
            try:
                g.client.info(timeout_s=self._health_timeout_s)
            except grpc.RpcError as exc:
                return exc
            return None

        with ThreadPoolExecutor(len(generators)) as pool:
            problems = list(pool.map(probe, generators))
        alive = []
        for g, problem in zip(generators, problems):
            if problem is None:
                alive.append(g)
                continue
            self._log.warning("generator_unhealthy", member_id=g.member_id, code=problem.code().name)
            self._current.discard(g.member_id)
            if self._on_dead is not None:
                self._on_dead(g, problem)
        return alive


def shared_memory_dir() -> Path:
    """This user's directory on the host's shared memory (/dev/shm, else the temp dir), mode 0700."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    path = base / f"tandem-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path
