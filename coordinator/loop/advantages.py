"""Advantages from rewards: pure functions over tensors of shape (num_prompts, num_generations).

Estimators (`grpo.adv_estimator.name`, chosen once by `build_advantage_fn`):
- grpo: per-prompt group baseline (leave-one-out or mean), optionally divided by the std of
  the same rewards the baseline averages (leave-one-out too, as NeMo-RL). RLOO is grpo with
  the leave-one-out baseline and no std normalisation.
- reinforce_plus_plus: group-mean baseline (optional), then normalisation to zero mean and unit
  variance over the batch's loss tokens (each sample weighted by its token count), as NeMo-RL.
- raw_reward: the reward itself (plain REINFORCE).
Around them: `kl_penalized_rewards` (KL in the reward) before, `clip_advantages` after.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

_EPS = 1e-6

AdvantageFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
"""(rewards (P, G), loss-token counts (P, G) or None) -> advantages (P, G)."""


def _check(rewards_PG: torch.Tensor) -> None:
    if rewards_PG.dim() != 2 or rewards_PG.shape[1] < 2:
        raise ValueError(f"rewards must be (prompts, generations>=2), got {tuple(rewards_PG.shape)}")


def compute_advantages(rewards_PG: torch.Tensor, *, leave_one_out: bool = True,
                       normalize: bool = True) -> torch.Tensor:
    """GRPO advantages for rewards of shape (P, G) (P prompts, G samples each), with NeMo-RL's
    semantics (`calculate_baseline_and_std_per_prompt` and its GRPO estimator).

    Each sample i of a group is compared with a reference set: the *other* G-1 rewards of its
    group (leave-one-out, as in RLOO and NeMo-RL's `use_leave_one_out_baseline`) or all G.
    Its baseline is the mean of that set, and with `normalize` the centred reward is divided by
    the set's unbiased std plus 1e-6. Where that std is zero (a set whose rewards are all
    equal, or a set of one: leave-one-out with G=2) the centred reward is kept as it is,
    not sharpened. A group whose rewards are all equal gets zero advantage either way.
    """
    _check(rewards_PG)
    rewards = rewards_PG.to(torch.float64)
    num_generations = rewards.shape[1]
    # in_set_GG[i, j]: sample j belongs to sample i's reference set.
    in_set_GG = torch.ones(num_generations, num_generations, dtype=torch.bool)
    if leave_one_out:
        in_set_GG.fill_diagonal_(False)
    advantages = rewards - _set_mean(rewards, in_set_GG)
    if normalize:
        std = _set_std(rewards, in_set_GG)
        advantages = torch.where(std > 0, advantages / (std + _EPS), advantages)
    return advantages.to(rewards_PG.dtype)


def _set_mean(rewards_PG: torch.Tensor, in_set_GG: torch.Tensor) -> torch.Tensor:
    """(P, G): the mean of each sample's reference set."""
    weights = in_set_GG.to(rewards_PG.dtype)
    return rewards_PG @ weights.T / weights.sum(dim=1)


def _set_std(rewards_PG: torch.Tensor, in_set_GG: torch.Tensor) -> torch.Tensor:
    """(P, G): the unbiased std of each sample's reference set, exactly 0 where the set has
    fewer than two members or all its rewards are equal.

    Two-pass (deviations from the set's mean) in float64, and an exact zero test on the set's
    min and max: NeMo-RL's one-pass E[r^2] - E[r]^2 in float32 leaves a spurious std near 1e-4
    on a set of equal rewards (0.3 eight times), which its `std > 0` test then divides by.
    """
    size_G = in_set_GG.sum(dim=1)
    members_PGG = rewards_PG[:, None, :].expand(-1, in_set_GG.shape[0], -1)
    deviations_PGG = torch.where(in_set_GG, members_PGG - _set_mean(rewards_PG, in_set_GG)[:, :, None], 0.0)
    variance = deviations_PGG.square().sum(dim=2) / (size_G - 1).clamp(min=1)
    highest = torch.where(in_set_GG, members_PGG, -torch.inf).amax(dim=2)
    lowest = torch.where(in_set_GG, members_PGG, torch.inf).amin(dim=2)
    spread = (size_G >= 2) & (highest > lowest)
    return torch.where(spread, variance.sqrt(), torch.zeros_like(variance))


def reinforce_plus_plus_advantages(rewards_PG: torch.Tensor, token_counts_PG: torch.Tensor | None = None, *,
                                   minus_baseline: bool = True) -> torch.Tensor:
    """Group-mean baseline (if `minus_baseline`), then (a - mean) / std over the batch, where
    mean and (biased) variance weight each sample by its loss-token count (all 1 if None)."""
    _check(rewards_PG)
    rewards = rewards_PG.to(torch.float64)
    centred = rewards - rewards.mean(dim=1, keepdim=True) if minus_baseline else rewards
    weights = torch.ones_like(rewards) if token_counts_PG is None else token_counts_PG.to(torch.float64)
    total = weights.sum().clamp(min=1)
    mean = (centred * weights).sum() / total
    var = ((centred - mean).square() * weights).sum() / total
    return ((centred - mean) * var.clamp(min=1e-8).rsqrt()).to(rewards_PG.dtype)


def raw_reward_advantages(rewards_PG: torch.Tensor) -> torch.Tensor:
    """Plain REINFORCE: the advantage is the reward."""
    _check(rewards_PG)
    return rewards_PG.clone()


def clip_advantages(advantages: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Clamp to [-clip, clip]; None leaves them as they are."""
    if clip is None:
        return advantages
    if not clip > 0:
        raise ValueError(f"advantage clip must be > 0, got {clip}")
    return advantages.clamp(-clip, clip)


def kl_penalized_rewards(rewards_PG: torch.Tensor, sequence_kl_PG: torch.Tensor, beta: float) -> torch.Tensor:
    """KL in the reward: r - beta * KL(sequence), KL summed over the sequence's tokens."""
    if sequence_kl_PG.shape != rewards_PG.shape:
        raise ValueError(f"sequence KL {tuple(sequence_kl_PG.shape)} does not match rewards {tuple(rewards_PG.shape)}")
    return rewards_PG - beta * sequence_kl_PG.to(rewards_PG.dtype)


def build_advantage_fn(name: str, *, leave_one_out: bool, normalize: bool, minus_baseline: bool,
                       clip: float | None) -> AdvantageFn:
    """The estimator `name` with its options bound, followed by the clip (selected once)."""
    match name:
        case "grpo":
            def estimate(rewards, counts):
                return compute_advantages(rewards, leave_one_out=leave_one_out, normalize=normalize)
        case "reinforce_plus_plus":
            estimate = partial(_rpp, minus_baseline=minus_baseline)
        case "raw_reward":
            def estimate(rewards, counts):
                return raw_reward_advantages(rewards)
        case _:
            raise ValueError(f"unknown advantage estimator {name!r}: use grpo, reinforce_plus_plus or raw_reward")
    return lambda rewards, counts: clip_advantages(estimate(rewards, counts), clip)


def _rpp(rewards: torch.Tensor, counts: torch.Tensor | None, *, minus_baseline: bool) -> torch.Tensor:
    return reinforce_plus_plus_advantages(rewards, counts, minus_baseline=minus_baseline)
