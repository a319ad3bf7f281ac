"""What a step of any algorithm needs: config, services, tokens, data cursor, weights, and
the generators' phases around the trainer's work (coordinator/colocation.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from coordinator.colocation import GeneratorPhases
from coordinator.config import ExperimentConfig
from coordinator.data import Example, PromptCursor, Tokens
from coordinator.drift import DriftGuard
from coordinator.services import Services
from coordinator.weights import PublishReport, WeightPublisher, shared_memory_dir
from tandem.colocation import WeightTransport, resolve_colocation


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
    """Consecutive GRPO steps whose token_mult_prob_error is over the bound (coordinator/drift.py)."""

    @classmethod
    def connect(cls, cfg: ExperimentConfig, services: Services, tokens: Tokens, examples: list[Example], seed: int,
                log, *, op_timeout_s: float = 30.0) -> LoopContext:
        """The loop's context over live services, wired as every run uses it: the publisher
        drops generators that die during a publish, and rollouts only use generators serving
        the published version. Colocation (transport, sleep) is decided here, once, from the
        config and the trainer's device kind."""
        info = services.trainer.info()
        colocation = resolve_colocation(cfg.policy.generation.colocated.enabled, info.device_type)
        log.info("colocation", transport=colocation.transport.value, sleeps=colocation.sleeps,
                 device_type=info.device_type)
        shared_dir = shared_memory_dir() if colocation.transport is WeightTransport.SHARED_MEMORY else None
        publisher = WeightPublisher(services.trainer, info.weight_sync_store_address, info.bucket_plan, log,
                                    op_timeout_s=op_timeout_s, on_dead=services.generator_failed,
                                    shared_dir=shared_dir, cuda_ipc=colocation.transport is WeightTransport.CUDA_IPC)
        services.weights = publisher
        phases = GeneratorPhases(colocation, log, on_dead=services.generator_failed)
        return cls(cfg, services, tokens, PromptCursor(examples, seed), publisher, log, phases)

    def release_generators(self) -> None:
        """The rollouts are done and the trainer's work begins: colocated GPU generators sleep."""
        self.phases.release(self.services.all_generators())

    def publish(self, generators: Sequence | None = None, *, version: int | None = None) -> PublishReport:
        """Publish the trainer's weights to `generators` (default: every live one) as `version`
        (default: the next), waking sleeping generators around it."""
        targets = self.services.all_generators() if generators is None else list(generators)
        return self.phases.publish(lambda: self.publisher.publish(targets, version=version))
