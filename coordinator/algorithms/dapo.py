"""DAPO's additions to the GRPO step (https://arxiv.org/abs/2503.14476, NeMo-RL's `grpo.*` keys):

- dynamic sampling (`use_dynamic_sampling`): prompt groups whose task rewards all agree carry no
  signal and are dropped; more prompts are drawn (batch_multiplier x num_prompts_per_step per
  round) until num_prompts_per_step groups remain, at most dynamic_sampling_max_gen_batches
  rounds, then a clear error. Groups are judged on the raw task rewards, before shaping.
- overlong filtering (`overlong_filtering`): truncated completions get loss mask 0; their
  rewards still enter their group's baseline.
- overlong reward shaping (`reward_shaping`): a linear penalty over the last
  overlong_buffer_length tokens of the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from coordinator.config.algorithms import GRPOConfig
from coordinator.loop.groups import RolloutGroups


class DynamicSamplingExhausted(RuntimeError):
    """The generation-round cap was hit before the batch had enough groups with reward variance."""


def overlong_penalties(lengths_PG: torch.Tensor, *, max_response_length: int, buffer_length: int,
                       penalty: float) -> torch.Tensor:
    """min(0, -(length - (max_response_length - buffer_length)) / buffer_length * penalty):
    0 up to the start of the buffer, -penalty at the budget, linear in between."""
    expected = max_response_length - buffer_length
    excess = lengths_PG.to(torch.float32) - expected
    return (-excess / buffer_length * penalty).clamp(max=0.0)


def nonzero_variance(rewards_PG: torch.Tensor) -> torch.Tensor:
    """(P,) bool: the groups whose rewards are not all equal."""
    return (rewards_PG.max(dim=1).values - rewards_PG.min(dim=1).values) > 0


def overlong_loss_masks(rollouts: RolloutGroups) -> list[list[float] | None]:
    """Per sample in group order: all-zero mask for a truncated episode, else its own mask."""
    return [[0.0] * len(e.token_ids) if e.finish_reason == "length" else e.loss_mask
            for group in rollouts.groups for e in group]


def loss_token_counts(rollouts: RolloutGroups, masks: list[list[float] | None]) -> torch.Tensor:
    """(P, G) trained tokens per sample under `masks` (None: every token)."""
    lengths = [len(e.token_ids) for group in rollouts.groups for e in group]
    counts = [n if m is None else sum(1 for x in m if x > 0) for n, m in zip(lengths, masks)]
    return torch.tensor(counts, dtype=torch.float32).view(rollouts.rewards_PG.shape)


@dataclass(frozen=True)
class DynamicSamplingResult:
    rollouts: RolloutGroups
    metrics: dict[str, float]


def dynamic_sampling(draw: Callable[[int, int], RolloutGroups], num_prompts: int, *, batch_multiplier: float,
                     max_gen_batches: int) -> DynamicSamplingResult:
    """Draw rounds of ceil(batch_multiplier x num_prompts) prompt groups (`draw(round, size)`)
    and keep those with reward variance until num_prompts are kept; extra kept groups are
    discarded. Raises DynamicSamplingExhausted after max_gen_batches rounds."""
    per_round = math.ceil(batch_multiplier * num_prompts)
    kept: list[RolloutGroups] = []
    num_kept = num_zero_variance = 0
    for round_index in range(max_gen_batches):
        part = draw(round_index, per_round)
        keep = nonzero_variance(part.rewards_PG)
        num_zero_variance += int((~keep).sum())
        kept.append(part.select(torch.nonzero(keep).flatten().tolist()))
        num_kept += int(keep.sum())
        if num_kept >= num_prompts:
            merged = RolloutGroups.concat(kept)
            rollouts = merged.select(list(range(num_prompts)))
            return DynamicSamplingResult(rollouts, {
                "dynamic_sampling_num_gen_batches": float(round_index + 1),
                "dynamic_sampling_num_discarded_valid_samples": float((num_kept - num_prompts) * merged.num_generations),
                "dynamic_sampling_num_zero_variance_groups": float(num_zero_variance),
                "filtered_reward": float(rollouts.rewards_PG.mean()),
            })
    raise DynamicSamplingExhausted(
        f"dynamic sampling kept {num_kept} of the {num_prompts} prompt groups it needs (rewards not all equal) after "
        f"{max_gen_batches} generation rounds of {per_round} prompts; raise grpo.dynamic_sampling_max_gen_batches or "
        "grpo.batch_multiplier, use more generations per prompt, or use prompts the model solves sometimes but not always")


def draw_rollouts(grpo: GRPOConfig, draw: Callable[[int, int], RolloutGroups],
                  num_prompts: int | None = None) -> tuple[RolloutGroups, dict[str, float]]:
    """`num_prompts` prompt groups (default grpo.num_prompts_per_step): one round, or dynamic sampling."""
    num_prompts = grpo.num_prompts_per_step if num_prompts is None else num_prompts
    if not grpo.use_dynamic_sampling:
        return draw(0, num_prompts), {}
    result = dynamic_sampling(draw, num_prompts, batch_multiplier=grpo.batch_multiplier,
                              max_gen_batches=grpo.dynamic_sampling_max_gen_batches)
    return result.rollouts, result.metrics
