"""GRPO advantages: a per-prompt group baseline, optionally normalised by the group's std.

Pure functions over tensors of shape (num_prompts, num_generations).
"""

from __future__ import annotations

import torch

_EPS = 1e-6


def compute_advantages(rewards_PG: torch.Tensor, *, leave_one_out: bool = True,
                       normalize: bool = True) -> torch.Tensor:
    """Advantages for rewards of shape (P, G) (P prompts, G samples each).

    Baseline: the mean of the *other* G-1 rewards of the group (leave-one-out, as in RLOO
    and NeMo-RL's `use_leave_one_out_baseline`), or the group mean. With `normalize`, the
    centred rewards are divided by the group's (unbiased) std; a group whose rewards are all
    equal gets zero advantage either way.
    """
    if rewards_PG.dim() != 2 or rewards_PG.shape[1] < 2:
        raise ValueError(f"rewards must be (prompts, generations>=2), got {tuple(rewards_PG.shape)}")
    rewards = rewards_PG.to(torch.float64)
    num_generations = rewards.shape[1]
    total = rewards.sum(dim=1, keepdim=True)
    if leave_one_out:
        baseline = (total - rewards) / (num_generations - 1)
    else:
        baseline = total / num_generations
    advantages = rewards - baseline
    if normalize:
        std = rewards.std(dim=1, keepdim=True)
        advantages = torch.where(std > _EPS, advantages / (std + _EPS), torch.zeros_like(advantages))
    return advantages.to(rewards_PG.dtype)
