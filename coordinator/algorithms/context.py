"""What a step of any algorithm needs: config, services, tokens, data cursor, weights."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.config import ExperimentConfig
from coordinator.data import PromptCursor, Tokens
from coordinator.services import Services
from coordinator.weights import WeightPublisher


@dataclass
class LoopContext:
    cfg: ExperimentConfig
    services: Services
    tokens: Tokens
    cursor: PromptCursor
    publisher: WeightPublisher
    log: object

    def publish(self):
        return self.publisher.publish(self.services.all_generators())
