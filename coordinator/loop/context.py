"""What a step of any algorithm needs: config, services, tokens, data cursor, the weight
publisher, and the generators' phases around the trainer's work (weights/phases.py).

`LoopContext.connect` is the one place that wires them over live services, as every run
(and every integration test) uses them: the transport of weights and the sleep policy are
decided there, once, from the config and the trainer's device kind; rollouts only get
generators serving the published version; dead generators are dropped from membership.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from coordinator.config import ExperimentConfig
from coordinator.data.examples import Example, PromptCursor
from coordinator.data.tokens import Tokens
from coordinator.loop.drift import DriftGuard
from coordinator.loop.scoring import RewardRouter
from coordinator.loop.weights.phases import GeneratorPhases
from coordinator.loop.weights.publisher import WeightPublisher
from coordinator.loop.weights.transports import CudaIpcTransport, PublishReport, build_transport
from coordinator.membership.services import GeneratorHandle, Services
from coordinator.membership.versions import WeightVersions
from tandem.colocation import resolve_colocation


class Stopped(Exception):
    """A wait for a missing service ended because the loop is stopping."""


@dataclass
class LoopContext:
    cfg: ExperimentConfig
    services: Services
    tokens: Tokens
    cursor: PromptCursor
    publisher: WeightPublisher
    log: object
    phases: GeneratorPhases
    drift: DriftGuard = field(default_factory=DriftGuard)
    """Consecutive GRPO steps whose token_mult_prob_error is over the bound (loop/drift.py)."""
    generator_wait_s: float = 0.0
    """How long `generators()` waits for one while none is live (one being relaunched, or yet to join)."""
    _publishing: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "publish"), repr=False)
    _detached: list[Future] = field(default_factory=list, repr=False)
    _last_detached: int = 0
    reward_seconds: float = 0.0
    """Time spent in reward service calls so far (a step's reward time is the difference)."""
    agents: object | None = None
    """The rollout gateway and agent runner (loop/gateway/agents.py AgentRunner), started by the first
    agent task's rollout (loop/rollouts.py agent_runner); None until then."""
    stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    """Set while the loop stops (the rollout pipeline's stop): waits for a missing service end (`pause`)."""

    @classmethod
    def connect(cls, cfg: ExperimentConfig, services: Services, tokens: Tokens, examples: list[Example], seed: int,
                log, *, op_timeout_s: float = 30.0, versions: WeightVersions | None = None) -> LoopContext:
        """The loop's context over live services. `versions`: the run's weight versions (kept
        across trainer restarts, shown by `tandem status`); default a fresh one."""
        info = services.trainer.info()
        colocation = resolve_colocation(cfg.policy.generation.colocated.enabled, info.device_type,
                                        shares_device=cfg.generators_share_trainer_device,
                                        free_weights=cfg.generators_free_weights)
        log.info("colocation", transport=colocation.transport.value, sleeps=colocation.sleeps,
                 sleep_level=colocation.sleep_level,
                 device_type=info.device_type)
        transport = build_transport(colocation.transport, services.trainer, info.bucket_plan,
                                    info.weight_sync_store_address, log, op_timeout_s=op_timeout_s)
        publisher = WeightPublisher(services.trainer, transport, log, versions=versions,
                                    on_dead=services.generator_failed)
        phases = GeneratorPhases(colocation, log, on_dead=services.generator_failed)
        if isinstance(transport, CudaIpcTransport):
            transport.before_load = phases.wake_weights  # sleeping weights wake after the trainer's export
        return cls(cfg, services, tokens, PromptCursor(examples, seed), publisher, log, phases,
                   generator_wait_s=cfg.cluster.startup_timeout_s)

    def generators(self) -> list[GeneratorHandle]:
        """The live generators that may get work: those serving the published version (stale ones
        are brought up to date first where possible). With none, waits up to generator_wait_s
        for one (the local launcher relaunches a dead generator; others may join)."""
        live = self.publisher.admit(self.services.all_generators())
        deadline = time.monotonic() + self.generator_wait_s
        while not live and time.monotonic() < deadline:
            self.pause(0.5)
            live = self.publisher.admit(self.services.all_generators())
        return live

    def rewards(self) -> RewardRouter:
        """Routes by task to the live reward services, looked up again before every call (so a
        swapped service takes over at once), retrying a dead one's calls (loop/scoring.py)."""
        return RewardRouter(self.services.reward_clients(), refresh=self.services.reward_clients,
                            on_failure=self.services.reward_failed, log=self.log, on_time=self._add_reward_time,
                            sleep=self.pause)

    def pause(self, seconds: float) -> None:
        """Wait `seconds` before looking for a missing service again; raises Stopped at once
        when the loop is stopping (no stop waits for a service that is not coming back)."""
        if self.stopping.wait(seconds):
            raise Stopped("the run is stopping: no more waiting for services")

    def _add_reward_time(self, seconds: float) -> None:
        self.reward_seconds += seconds

    def release_generators(self) -> None:
        """The rollouts are done and the trainer's work begins: generators sharing the trainer's
        memory sleep (colocated on GPUs) or free their weights (CPU, synchronous runs)."""
        self.phases.release(self.services.all_generators())

    def publish(self, generators: Sequence[GeneratorHandle] | None = None, *,
                version: int | None = None) -> PublishReport:
        """Publish the trainer's weights to `generators` (default: every live one) as `version`
        (default: the next), waking sleeping generators around it."""
        self.wait_published()
        targets = self.services.all_generators() if generators is None else list(generators)
        return self.phases.publish(lambda: self.publisher.publish(targets, version=version))

    def publish_detached(self, on_published: Callable[[], None]) -> int:
        """Async GRPO: publish the next version with the trainer's part detached. Returns (the
        version) once the trainer holds its copy (HoldWeights) and may train on; the generators
        get it in the background (health checks, the broadcast of that copy, retries), then
        `on_published()` runs. The version before must have reached the generators first (the
        trainer holds one copy: a retry of it must still find it); it normally has, while this
        step trained. An error of a publish is raised by the next publish or wait_published()."""
        self.wait_published()
        version = self.trainer_version + 1
        self.publisher.hold(version)
        self._last_detached = version

        def publish() -> None:
            self.publisher.publish(self.services.all_generators(), version=version)
            on_published()

        self._detached.append(self._publishing.submit(publish))
        return version

    @property
    def trainer_version(self) -> int:
        """The version of the trainer's weights: the last published, or a detached one on its way."""
        return max(self.publisher.version, self._last_detached)

    def wait_published(self) -> None:
        """Wait for the detached publishes in flight; raise the first one's error."""
        while self._detached:
            self._detached[0].exception()  # waits
            self._raise_failed_publish()
            if self._detached and self._detached[0].done():
                self._detached.pop(0)

    def _raise_failed_publish(self) -> None:
        done = [f for f in self._detached if f.done()]
        self._detached = [f for f in self._detached if not f.done()]
        for future in done:
            if future.exception() is not None:
                raise future.exception()
