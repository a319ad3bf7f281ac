"""DAPO's filters in the GRPO step (https://arxiv.org/abs/2503.14476, NeMo-RL's `grpo.*` keys);
its dynamic sampling (`use_dynamic_sampling`) is part of producing the rollouts
(coordinator/loop/rollouts.py).

- overlong filtering (`overlong_filtering`): truncated completions get loss mask 0; their
  rewards still enter their group's baseline.
- overlong reward shaping (`reward_shaping`): a linear penalty over the last
  overlong_buffer_length tokens of the budget.
"""

from __future__ import annotations

import torch

from coordinator.loop.groups import RolloutGroups


def overlong_penalties(lengths_PG: torch.Tensor, *, max_response_length: int, buffer_length: int,
                       penalty: float) -> torch.Tensor:
    """min(0, -(length - (max_response_length - buffer_length)) / buffer_length * penalty):
    0 up to the start of the buffer, -penalty at the budget, linear in between."""
    expected = max_response_length - buffer_length
    excess = lengths_PG.to(torch.float32) - expected
    return (-excess / buffer_length * penalty).clamp(max=0.0)


def overlong_loss_masks(rollouts: RolloutGroups) -> list[list[float] | None]:
    """Per sample in group order: all-zero mask for a truncated episode, else its own mask."""
    return [[0.0] * len(e.token_ids) if e.finish_reason == "length" else e.loss_mask
            for group in rollouts.groups for e in group]


def loss_token_counts(rollouts: RolloutGroups, masks: list[list[float] | None]) -> torch.Tensor:
    """(P, G) trained tokens per sample under `masks` (None: every token)."""
    lengths = [len(e.token_ids) for group in rollouts.groups for e in group]
    counts = [n if m is None else sum(1 for x in m if x > 0) for n, m in zip(lengths, masks)]
    return torch.tensor(counts, dtype=torch.float32).view(rollouts.rewards_PG.shape)
