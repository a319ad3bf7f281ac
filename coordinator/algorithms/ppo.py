"""PPO with a critic (`ppo.*`, coordinator/config/ppo.py): GRPO's step (coordinator/algorithms/grpo.py)
with the group baseline replaced by a learned one.

    rollouts  = the policy's samples, scored by the task's rewards          as in GRPO
    rewards   = task rewards, shaped (overlong penalty, KL in the reward)   as in GRPO
    values    = the critic's value of every sampled token's state           one ComputeValues on the critic service
    GAE       = per-token advantages and returns                            coordinator/loop/gae.py (ppo.gamma, ppo.lam),
                the reward on each completion's last trained token          whitened over the batch (ppo.normalize_advantages)
    train     = the policy on the advantages (loss_fn's clipped loss)       trainer, concurrently with
                the critic on the returns (the clipped value loss)          the critic service (ppo.critic.*)

The step's metrics add, before the update, the critic's value_mean, return_mean and
explained_variance (1 - Var(returns - values) / Var(returns): how much of the returns the
critic predicts), and the critic's training metrics as critic_<name> (critic_value_loss,
critic_value_clip_fraction, critic_grad_norm, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from coordinator.loop.context import LoopContext
from coordinator.loop.gae import explained_variance, gae_advantages, padded, terminal_rewards, whiten
from trainer_svc.types import LossConfig, Sample, StepResult


def critic_valued(ctx: LoopContext, samples: list[Sample], rewards: Sequence[float]) -> tuple[list[Sample], dict[str, float]]:
    """`samples` (one per reward) with the critic's values, GAE's per-token advantages and returns,
    and the metrics of them."""
    ppo = ctx.cfg.ppo
    assert ppo is not None and ppo.critic is not None, "critic_valued runs in ppo runs only"
    values = ctx.services.critic.values(samples, micro_batch_size=ppo.critic.value_batch_size
                                        or ctx.cfg.policy.logprob_batch_size)
    masks = [list(s.loss_mask) if s.loss_mask is not None else [1.0] * s.completion_length for s in samples]
    advantages, returns, metrics = ppo_advantages(rewards, values, masks, gamma=ppo.gamma, lam=ppo.lam,
                                                  normalize=ppo.normalize_advantages)
    valued = [replace(s, advantage=0.0, token_advantages=a, returns=r, values=v)
              for s, a, r, v in zip(samples, advantages, returns, values)]
    return valued, metrics


def ppo_advantages(rewards: Sequence[float], values: Sequence[Sequence[float]], masks: Sequence[Sequence[float]], *,
                   gamma: float, lam: float, normalize: bool) -> tuple[list[list[float]], list[list[float]], dict[str, float]]:
    """Per sample: GAE's advantages (whitened with `normalize`) and returns, one per completion
    token; with value_mean, return_mean, explained_variance and advantage_abs_mean over the trained tokens."""
    mask_BL, values_BL = padded([list(m) for m in masks]), padded([list(v) for v in values])
    if values_BL.shape != mask_BL.shape:
        raise ValueError(f"the critic returned values of shape {tuple(values_BL.shape)} for completions of "
                         f"{tuple(mask_BL.shape)}")
    rewards_BL = terminal_rewards(torch.tensor(list(rewards), dtype=torch.float32), mask_BL)
    advantages_BL, returns_BL = gae_advantages(rewards_BL, values_BL, mask_BL, gamma=gamma, lam=lam)
    if normalize:
        advantages_BL = whiten(advantages_BL, mask_BL)
    inside = mask_BL > 0
    count = max(int(inside.sum()), 1)
    metrics = {"value_mean": float(values_BL[inside].sum()) / count,
               "return_mean": float(returns_BL[inside].sum()) / count,
               "explained_variance": explained_variance(values_BL, returns_BL, mask_BL),
               "advantage_abs_mean": float(advantages_BL[inside].abs().sum()) / count}
    lengths = [len(m) for m in masks]
    return ([row[:n] for row, n in zip(advantages_BL.tolist(), lengths)],
            [row[:n] for row, n in zip(returns_BL.tolist(), lengths)], metrics)


def train_with_critic(ctx: LoopContext, samples: list[Sample], policy_loss: LossConfig) -> StepResult:
    """The policy's train step and the critic's, at once (two services); the critic's metrics as critic_<name>."""
    cfg = ctx.cfg
    critic = cfg.ppo.critic
    with ThreadPoolExecutor(1, thread_name_prefix="critic-train") as pool:
        critic_step = pool.submit(ctx.services.critic.train_step, samples, critic.trainer_loss(),
                                  global_batch_size=critic.train_global_batch_size or cfg.policy.train_global_batch_size,
                                  micro_batch_size=critic.train_micro_batch_size or cfg.policy.train_micro_batch_size)
        policy = ctx.services.trainer.train_step(samples, policy_loss, global_batch_size=cfg.policy.train_global_batch_size,
                                                 micro_batch_size=cfg.policy.train_micro_batch_size)
        critic_metrics = critic_step.result().metrics
    return StepResult({**policy.metrics, **{f"critic_{k}": v for k, v in critic_metrics.items()}}, policy.global_step)
