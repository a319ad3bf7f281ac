"""The algorithms trained on preference pairs, through the trainer service alone (no generator):

- DPO (https://arxiv.org/abs/2305.18290, NeMo-RL's `dpo.*` keys): each step sends
  policy.train_global_batch_size pairs to the trainer, which scores them under the frozen
  reference and takes one optimizer step on the DPO loss (`trainer_svc/losses/preference.py`).
  Validation scores held-out pairs under the current and reference policy (ComputeLogprobs) and
  reports DPO's reward accuracy and margin on them.
- Reward-model training (Bradley-Terry, NeMo-RL's `rm.*`): each step sends
  policy.train_global_batch_size pairs to a trainer that holds a one-output sequence classifier
  (policy.reward_model_cfg.enabled) and takes one optimizer step on
  -log sigmoid(score(chosen) - score(rejected)). The run ends with an HF export that reward_svc's
  reward_model scorer serves (env.<task>.reward_model.model_name).

A pair becomes two adjacent trainer samples, chosen first.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.config import ExperimentConfig
from coordinator.data.examples import PromptCursor
from coordinator.data.preference import PreferencePair
from coordinator.data.tokens import Tokens
from trainer_svc.client import TrainerClient
from trainer_svc.types import BradleyTerryLossConfig, Sample


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


def dpo_step(ctx: PreferenceContext) -> dict[str, float]:
    samples = policy_samples(ctx.tokens, ctx.next_pairs())
    result = ctx.trainer.train_step(samples, ctx.cfg.dpo.trainer_loss(), **ctx.batch_sizes())
    return {**result.metrics, "num_pairs": len(samples) / 2.0}


class DpoValidator:
    """Held-out reward accuracy: r = sum over response tokens of (policy - reference) logprob
    (averaged with dpo.preference_average_log_probs); a pair counts when r_chosen > r_rejected.
    The reference logprobs never change, so they are computed once."""

    def __init__(self, ctx: PreferenceContext, pairs: list[PreferencePair]):
        self._ctx = ctx
        self._samples = policy_samples(ctx.tokens, pairs)
        self._micro = 2 * ctx.cfg.policy.logprob_batch_size
        self._reference = ctx.trainer.logprobs(self._samples, "reference", self._micro)

    def __call__(self) -> dict[str, float]:
        current = self._ctx.trainer.logprobs(self._samples, "current", self._micro)
        average = self._ctx.cfg.dpo.preference_average_log_probs
        rewards = [(sum(c) - sum(r)) / (len(c) if average else 1) for c, r in zip(current, self._reference)]
        margins = [rewards[i] - rewards[i + 1] for i in range(0, len(rewards), 2)]
        return {"accuracy": sum(m > 0 for m in margins) / len(margins),
                "reward_margin": sum(margins) / len(margins)}


def rm_step(ctx: PreferenceContext) -> dict[str, float]:
    samples = reward_model_samples(ctx.tokens, ctx.next_pairs())
    result = ctx.trainer.train_step(samples, BradleyTerryLossConfig(), **ctx.batch_sizes())
    return {**result.metrics, "num_pairs": len(samples) / 2.0}
