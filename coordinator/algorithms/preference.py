"""DPO and reward-model training: the loop's context, and turning preference pairs into the
trainer's samples ((chosen, rejected) adjacent, chosen first)."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.config import ExperimentConfig
from coordinator.data.examples import PromptCursor
from coordinator.data.preference import PreferencePair
from coordinator.data.tokens import Tokens
from trainer_svc.client import TrainerClient
from trainer_svc.types import Sample


@dataclass
class PreferenceContext:
    """What a DPO or RM step needs: config, the trainer, tokens and the pairs' cursor."""

    cfg: ExperimentConfig
    trainer: TrainerClient
    tokens: Tokens
    cursor: PromptCursor
    log: object

    def next_pairs(self) -> list[PreferencePair]:
        return self.cursor.next_batch(self.cfg.policy.train_global_batch_size)

    def batch_sizes(self) -> dict[str, int]:
        """Trainer batch sizes in samples: the policy's sizes count pairs."""
        policy = self.cfg.policy
        return {"global_batch_size": 2 * policy.train_global_batch_size,
                "micro_batch_size": 2 * policy.train_micro_batch_size}


def policy_samples(tokens: Tokens, pairs: list[PreferencePair]) -> list[Sample]:
    """DPO: BOS + prompt, then the response and EOS as the completion (as SFT trains it)."""
    samples = []
    for pair in pairs:
        prompt = tokens.prompt(pair.prompt)
        for response in (pair.chosen, pair.rejected):
            samples.append(Sample(prompt + tokens.answer(response), len(prompt)))
    return samples


def reward_model_samples(tokens: Tokens, pairs: list[PreferencePair]) -> list[Sample]:
    """RM: prompt + response tokenised as one text, as reward_svc's scorer reads it at serving
    time (no EOS appended), so the trained score head sees what it will score."""
    samples = []
    for pair in pairs:
        prompt_length = len(tokens.prompt(pair.prompt))
        for response in (pair.chosen, pair.rejected):
            ids = tokens.prompt(pair.prompt + response)
            samples.append(Sample(ids, max(1, min(prompt_length, len(ids) - 1))))
    return samples
