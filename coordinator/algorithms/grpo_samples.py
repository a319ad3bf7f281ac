"""From a step's prompt groups to the trainer's samples: reward shaping, KL in the reward,
advantages and loss masks, each switched by its config key and nothing else.

    rewards   = task rewards
              + overlong penalty                      grpo.reward_shaping.enabled
              - beta * sum_t KL_t(generator || ref)   loss_fn.use_kl_in_reward (beta: reference_policy_kl_penalty)
    advantage = estimator(rewards), clipped           grpo.adv_estimator.name, grpo.advantage_clip
    loss mask = 0 on truncated completions            grpo.overlong_filtering

The KL in the reward uses the generator's logprobs of the sampled tokens as the policy side
and the trainer's reference logprobs (one ComputeLogprobs call), with loss_fn's estimator and clamps.
"""

from __future__ import annotations

import torch

from coordinator.algorithms.dapo import loss_token_counts, overlong_loss_masks, overlong_penalties
from coordinator.loop.advantages import build_advantage_fn, kl_penalized_rewards
from coordinator.loop.context import LoopContext
from coordinator.loop.groups import RolloutGroups
from tandem.kl import kl_estimate
from trainer_svc.types import Sample


def prepare_samples(ctx: LoopContext, rollouts: RolloutGroups) -> tuple[list[Sample], dict[str, float]]:
    """The trainer samples of `rollouts` and the metrics of the steps above."""
    cfg, grpo = ctx.cfg, ctx.cfg.grpo
    rewards = rollouts.rewards_PG.to(torch.float32)
    metrics: dict[str, float] = {}
    shaping = grpo.reward_shaping
    if shaping.enabled:
        penalty = overlong_penalties(rollouts.lengths_PG(),
                                     max_response_length=shaping.max_response_length or cfg.policy.generation.max_new_tokens,
                                     buffer_length=shaping.overlong_buffer_length,
                                     penalty=shaping.overlong_buffer_penalty)
        rewards = rewards + penalty
        metrics["overlong_penalty_mean"] = float(penalty.mean())
    if cfg.loss_fn.use_kl_in_reward:
        kl_PG = sequence_kl(ctx, rollouts)
        rewards = kl_penalized_rewards(rewards, kl_PG, cfg.loss_fn.reference_policy_kl_penalty)
        metrics["kl_in_reward_mean"] = float(kl_PG.mean())
    masks = [e.loss_mask for group in rollouts.groups for e in group]
    if grpo.overlong_filtering:
        masks = overlong_loss_masks(rollouts)
        metrics["overlong_filtered_samples"] = float(sum(e.finish_reason == "length"
                                                         for group in rollouts.groups for e in group))
    counts = loss_token_counts(rollouts, masks)
    estimator = grpo.adv_estimator
    advantage_fn = build_advantage_fn(estimator.name, leave_one_out=grpo.use_leave_one_out_baseline,
                                      normalize=grpo.normalize_rewards, minus_baseline=estimator.minus_baseline,
                                      clip=grpo.advantage_clip)
    advantages = advantage_fn(rewards, counts)
    metrics.update(reward_shaped_mean=float(rewards.mean()), advantage_abs_mean=float(advantages.abs().mean()))
    return rollouts.samples(advantages, masks), metrics


def sequence_kl(ctx: LoopContext, rollouts: RolloutGroups) -> torch.Tensor:
    """(P, G): per completion, the sum over its tokens of the KL estimate of the generating
    policy against the trainer's reference policy."""
    loss = ctx.cfg.loss_fn
    samples = rollouts.samples()
    reference = ctx.services.trainer.logprobs(samples, policy="reference",
                                              micro_batch_size=ctx.cfg.policy.logprob_batch_size)
    totals = []
    for s, ref in zip(samples, reference):  # only the model's own tokens (multi-turn masks skip the environment's)
        kl = kl_estimate(torch.tensor(s.generation_logprobs), torch.tensor(ref), loss.reference_policy_kl_type,
                         input_clamp=loss.kl_input_clamp_value, output_clamp=loss.kl_output_clamp_value)
        totals.append(float(kl.sum() if s.loss_mask is None else (kl * torch.tensor(s.loss_mask)).sum()))
    return torch.tensor(totals, dtype=torch.float32).view(rollouts.rewards_PG.shape)
