"""Prompt groups of one GRPO step: each prompt's episodes and their task rewards, in order.

Shapes: rewards_PG and correct_PG are (P prompts, G generations); groups[p][g] is the episode
(`coordinator.multiturn.Episode`: one completion, or a multi-turn exchange with its own loss
mask) whose reward is rewards_PG[p, g].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from coordinator.data.examples import Example
from coordinator.loop.ledger import Dropped, DropReason, GroupIds
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
    draws: tuple[int, ...] = ()
    """Each group's prompt's draw index (PromptCursor.drawn; its samples' ids: coordinator/loop/ledger.py)."""
    dropped: tuple[Dropped, ...] = ()
    """Groups drawn for these and not kept (dynamic sampling's), with the reason."""

    @property
    def num_generations(self) -> int:
        return self.rewards_PG.shape[1]

    def select(self, indices: Sequence[int]) -> RolloutGroups:
        """The groups at `indices`, in that order (the dropped ones stay as they are)."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        return RolloutGroups([self.examples[i] for i in indices], [self.prompts[i] for i in indices],
                             [self.groups[i] for i in indices], self.rewards_PG[index], self.correct_PG[index],
                             tuple(self.draws[i] for i in indices) if self.draws else (), self.dropped)

    def drop(self, indices: Sequence[int], reason: DropReason) -> RolloutGroups:
        """These groups without those at `indices`, which are recorded as dropped for `reason`."""
        ids = self.ids()
        gone = set(indices)
        kept = self.select([i for i in range(len(self.groups)) if i not in gone])
        return replace(kept, dropped=(*self.dropped, *(Dropped(ids[i], reason) for i in indices if ids)))

    def ids(self) -> tuple[GroupIds, ...]:
        """Each group's sample ids (empty without draws: groups not drawn from the run's cursor)."""
        if not self.draws:
            return ()
        return tuple(GroupIds(d, tuple(e.weight_version for e in group)) for d, group in zip(self.draws, self.groups))

    @staticmethod
    def concat(parts: Sequence[RolloutGroups]) -> RolloutGroups:
        draws = tuple(d for p in parts for d in p.draws) if all(p.draws or not p.groups for p in parts) else ()
        return RolloutGroups([e for p in parts for e in p.examples], [x for p in parts for x in p.prompts],
                             [g for p in parts for g in p.groups], torch.cat([p.rewards_PG for p in parts]),
                             torch.cat([p.correct_PG for p in parts]), draws,
                             tuple(d for p in parts for d in p.dropped))

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
                                  advantage=0.0 if advantages_PG is None else float(advantages_PG[p, g]),
                                  routed_experts=c.routed_experts or None))
        return out
