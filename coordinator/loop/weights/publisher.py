"""Publishing weight versions: the trainer's weights go to every live generator as version
v+1 through the run's transport (transports.py), with health checks, retries and admission.

Failures. Before a publish every receiver is health-checked (GetInfo with a short deadline),
so a generator already dead costs nothing. A publish that fails part-way (a receiver died
during the broadcast: the trainer notices through gloo's per-operation timeout or a reset
connection) is retried, with the receivers that still answer, after the transport is reset
(a new weight-sync epoch); the dead are reported through `on_dead` (the registry drops them).
At most `max_attempts` attempts, then `PublishError` naming each attempt's failure. A refusal
of the request itself (RpcFailure.status.rejects_request) is raised at once. With no live
generator left (the only one died and is being relaunched), the publish records the version
without sending it: the next generator to come is brought up to it by `admit`.

Admission. Generators swap atomically (generator_svc), so none serves a half-received
version; but one that missed a version (it joined late, or a publish to it failed) serves
old weights. `admit` keeps such a generator out of the rollout until it serves the published
version (the rule is coordinator.membership.versions.WeightVersions'), bringing it up to date
first (a publish of the current version to just the stale ones) when the trainer still holds
exactly that version.

Thread-safe: with async GRPO the rollout producer admits generators (and may catch one up)
while the step loop publishes; publishes, catch-ups included, run one at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from coordinator.loop.weights.transports import PublishReport, WeightTransport
from coordinator.membership.services import GeneratorHandle
from coordinator.membership.versions import WeightVersions
from tandem.rpc import RpcFailure


class PublishError(RuntimeError):
    """A publish failed on every attempt, or nothing is left to publish to."""


class WeightPublisher:
    def __init__(self, trainer, transport: WeightTransport, log, *, versions: WeightVersions | None = None,
                 max_attempts: int = 3, health_timeout_s: float = 5.0,
                 on_dead: Callable[[GeneratorHandle, Exception], None] | None = None):
        self._trainer = trainer
        self.transport = transport
        self._log = log
        self.versions = versions or WeightVersions()
        self._max_attempts = max_attempts
        self._health_timeout_s = health_timeout_s
        self._on_dead = on_dead
        self._trainer_step: int | None = None  # the trainer's global step when versions.version was sent
        self._lock = threading.RLock()

    @property
    def version(self) -> int:
        return self.versions.version

    @property
    def epoch(self) -> int:
        """The epoch of the last weight-sync group formed (-1: none, or a transport without groups)."""
        return self.transport.epoch

    def publish(self, generators: Sequence[GeneratorHandle], *, version: int | None = None) -> PublishReport:
        """Send the trainer's weights to `generators` as `version` (default: version+1). An
        explicit version re-labels nothing new: resume uses it to send the restored weights
        under the version the checkpoint holds, and async GRPO the copy the trainer holds of it
        (LoopContext.publish_detached; every retry resends that copy)."""
        with self._lock:
            target = self.version + 1 if version is None else version
            if target < self.version:
                raise ValueError(f"version {target} is older than the published version {self.version}")
            report, acked = self._publish_with_retries(list(generators), target)
            self.versions.published(target, acked)
            self._trainer_step = self._trainer.info().global_step
            return report

    def hold(self, version: int) -> None:
        """Async GRPO: the trainer copies its weights as `version`, which `publish(version=...)`
        sends later. Until then no generator is caught up: the trainer's weights and its held
        copy are no longer the published version."""
        with self._lock:
            self._trainer.hold_weights(version)
            self._trainer_step = None

    def admit(self, generators: Sequence[GeneratorHandle]) -> list[GeneratorHandle]:
        """The generators that serve the current version; stale ones are brought up to
        date first when that is safe (the trainer has not stepped since the last publish)."""
        stale = [g for g in generators if not self.versions.is_current(g.member_id)]
        if stale:
            with self._lock:
                self._catch_up([g for g in stale if not self.versions.is_current(g.member_id)])
        return [g for g in generators if self.versions.is_current(g.member_id)]

    def _catch_up(self, stale: list[GeneratorHandle]) -> None:
        if not stale:
            return
        if self._trainer_step is None or self._trainer.info().global_step != self._trainer_step:
            self._log.info("generators_not_admitted", version=self.version, generators=[g.member_id for g in stale])
            return
        self._log.info("weights_catch_up", version=self.version, generators=[g.member_id for g in stale])
        try:
            _, acked = self._publish_with_retries(stale, self.version)
            self.versions.caught_up(acked)
        except PublishError as exc:
            self._log.warning("weights_catch_up_failed", error=str(exc))

    def _publish_with_retries(self, generators: list[GeneratorHandle], version: int) -> tuple[PublishReport, set[str]]:
        errors: list[str] = []
        live = self._healthy(generators)
        for attempt in range(1, self._max_attempts + 1):
            if not live:  # nobody to send to: the version stands, and `admit` catches up whoever comes next
                self._log.warning("published_to_nobody", version=version, earlier_attempts=errors)
                return PublishReport(version, self.transport.epoch, 0, 0, 0.0, attempt), set()
            started = time.perf_counter()
            try:
                report = self.transport.send(live, version)
            except RpcFailure as exc:
                if exc.status.rejects_request:
                    raise
                epoch = self.transport.epoch
                self.transport.reset()
                seconds = time.perf_counter() - started
                errors.append(f"attempt {attempt} (epoch {epoch}, {seconds:.1f}s): {exc}")
                self._log.warning("publish_failed", version=version, epoch=epoch, attempt=attempt,
                                  seconds=round(seconds, 3), code=exc.status.name, error=exc.details)
                self._check_trainer(errors)
                live = self._healthy(live)
                continue
            return PublishReport(report.version, report.epoch, report.num_generators, report.bytes_sent,
                                 report.duration_s, attempt), {g.member_id for g in live}
        raise PublishError(f"publishing weight version {version} failed {self._max_attempts} times: "
                           + "; ".join(errors))

    def _check_trainer(self, errors: list[str]) -> None:
        try:
            self._trainer.info()
        except RpcFailure as exc:
            raise PublishError(f"the trainer does not answer ({exc.status.name}); no retry can help: "
                               + "; ".join(errors)) from exc

    def _healthy(self, generators: list[GeneratorHandle]) -> list[GeneratorHandle]:
        """The generators that answer GetInfo; the others are reported through on_dead."""
        if not generators:
            return []

        def probe(g: GeneratorHandle) -> RpcFailure | None:
            try:
                g.client.info(timeout_s=self._health_timeout_s)
            except RpcFailure as exc:
                return exc
            return None

        with ThreadPoolExecutor(len(generators)) as pool:
            problems = list(pool.map(probe, generators))
        alive = []
        for g, problem in zip(generators, problems):
            if problem is None:
                alive.append(g)
                continue
            self._log.warning("generator_unhealthy", member_id=g.member_id, code=problem.status.name)
            self.versions.forget(g.member_id)
            if self._on_dead is not None:
                self._on_dead(g, problem)
        return alive
