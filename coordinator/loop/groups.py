"""Prompt groups of one GRPO step: each prompt's episodes and their task rewards, in order.

Shapes: rewards_PG and correct_PG are (P prompts, G generations); groups[p][g] is the episode
(`coordinator.multiturn.Episode`: one completion, or a multi-turn exchange with its own loss
mask) whose reward is rewards_PG[p, g].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from coordinator.data.examples import Example
from coordinator.loop.multiturn import Episode
from trainer_svc.types import Sample


@dataclass(frozen=True)
class RolloutGroups:
    examples: list[Example]
    prompts: list[list[int]]
    groups: list[list[Episode]]
    rewards_PG: torch.Tensor
    """Task rewards as the reward services returned them (before shaping or KL)."""
    correct_PG: torch.Tensor

    @property
    def num_generations(self) -> int:
        return self.rewards_PG.shape[1]

    def select(self, indices: Sequence[int]) -> RolloutGroups:
        """The groups at `indices`, in that order."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        return RolloutGroups([self.examples[i] for i in indices], [self.prompts[i] for i in indices],
                             [self.groups[i] for i in indices], self.rewards_PG[index], self.correct_PG[index])

    @staticmethod
    def concat(parts: Sequence[RolloutGroups]) -> RolloutGroups:
        return RolloutGroups([e for p in parts for e in p.examples], [x for p in parts for x in p.prompts],
                             [g for p in parts for g in p.groups], torch.cat([p.rewards_PG for p in parts]),
                             torch.cat([p.correct_PG for p in parts]))

    def lengths_PG(self) -> torch.Tensor:
        """Completion lengths in tokens, (P, G)."""
        return torch.tensor([[len(c.token_ids) for c in group] for group in self.groups], dtype=torch.float32)

    def samples(self, advantages_PG: torch.Tensor | None = None,
                loss_masks: Sequence[Sequence[float] | None] | None = None) -> list[Sample]:
        """Trainer samples in group order (advantage 0 and the episodes' own masks where not given)."""
        out = []
        for p, (prompt, group) in enumerate(zip(self.prompts, self.groups)):
            for g, c in enumerate(group):
                mask = loss_masks[len(out)] if loss_masks is not None else c.loss_mask
                out.append(Sample(token_ids=prompt + list(c.token_ids), prompt_length=len(prompt),
                                  loss_mask=None if mask is None else list(mask),
                                  generation_logprobs=list(c.logprobs),
                                  advantage=0.0 if advantages_PG is None else float(advantages_PG[p, g])))
        return out
