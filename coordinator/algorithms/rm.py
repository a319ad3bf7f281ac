"""Reward-model training (Bradley-Terry, NeMo-RL's `rm.*`): each step sends
policy.train_global_batch_size preference pairs to a trainer that holds a one-output sequence
classifier (policy.reward_model_cfg.enabled) and takes one optimizer step on
-log sigmoid(score(chosen) - score(rejected)). The run ends with an HF export that reward_svc's
reward_model scorer serves (env.<task>.reward_model.model_name)."""

from __future__ import annotations

from coordinator.algorithms.preference import PreferenceContext, reward_model_samples
from trainer_svc.types import BradleyTerryLossConfig


def rm_step(ctx: PreferenceContext) -> dict[str, float]:
    samples = reward_model_samples(ctx.tokens, ctx.next_pairs())
    result = ctx.trainer.train_step(samples, BradleyTerryLossConfig(), **ctx.batch_sizes())
    return {**result.metrics, "num_pairs": len(samples) / 2.0}
