"""What a step of any algorithm needs: config, services, tokens, data cursor, weights."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.config import ExperimentConfig
from coordinator.data import Example, PromptCursor, Tokens
from coordinator.services import Services
from coordinator.weights import WeightPublisher, shared_memory_dir


@dataclass
class LoopContext:
    cfg: ExperimentConfig
    services: Services
    tokens: Tokens
    cursor: PromptCursor
    publisher: WeightPublisher
    log: object

    @classmethod
    def connect(cls, cfg: ExperimentConfig, services: Services, tokens: Tokens, examples: list[Example], seed: int,
                log, *, op_timeout_s: float = 30.0) -> LoopContext:
        """The loop's context over live services, wired as every run uses it: the publisher
        drops generators that die during a publish, and rollouts only use generators serving
        the published version."""
        info = services.trainer.info()
        shared_dir = shared_memory_dir() if cfg.policy.generation.colocated.enabled else None
        publisher = WeightPublisher(services.trainer, info.weight_sync_store_address, info.bucket_plan, log,
                                    op_timeout_s=op_timeout_s, on_dead=services.generator_failed,
                                    shared_dir=shared_dir)
        services.weights = publisher
        return cls(cfg, services, tokens, PromptCursor(examples, seed), publisher, log)

    def publish(self):
        return self.publisher.publish(self.services.all_generators())
