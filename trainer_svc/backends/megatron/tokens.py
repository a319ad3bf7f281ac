"""Per-token results of the Megatron model's output, with or without context parallelism.

Without CP the model sees whole rows and returns [B, T, V] logits. With CP each rank feeds its
load-balanced share of every row (trainer_svc/context_parallel.py) and gets the logits of those
positions only; the logprob of each position's next token (the labels are split with the
inputs) and its entropy are computed there and gathered into whole rows, so the losses, metrics
and logprob alignment are the same as without CP, on every CP rank.
"""

from __future__ import annotations

import torch

from trainer_svc import context_parallel as cp
from trainer_svc.losses import masked_entropy_sum


class TokenMath:
    def __init__(self, cp_size: int = 1, cp_rank: int = 0, cp_group=None, pad_id: int = 0, vocab_size: int = 0):
        self.cp_size, self._rank, self._group, self._pad = cp_size, cp_rank, cp_group, pad_id
        self._vocab = vocab_size

    @property
    def width_multiple(self) -> int:
        return cp.multiple(self.cp_size)

    @property
    def loss_scale(self) -> float:
        return cp.loss_scale(self.cp_size)

    def inputs(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, positions) this rank feeds the model."""
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)
        return cp.split(ids, self.cp_size, self._rank), cp.split(positions, self.cp_size, self._rank)

    def logits(self, output: torch.Tensor) -> torch.Tensor:
        return output[..., :self._vocab].float()

    def logprobs(self, output: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[B, T-1]: column j is log p(ids[:, j+1] | ids[:, :j+1]) (differentiable)."""
        logits = self.logits(output)
        if self.cp_size == 1:
            return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        labels = cp.split(cp.labels(ids, self._pad), self.cp_size, self._rank)
        local = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return cp.gather(local, self.cp_size, self._group)[:, :-1]

    def entropy_sum(self, output: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Sum of the predictive entropy over the masked-in positions of [B, T-1] `mask`."""
        logits = self.logits(output)
        if self.cp_size == 1:
            return masked_entropy_sum(logits[:, :-1], mask)
        with torch.no_grad():
            logp = torch.log_softmax(logits, dim=-1)
            local = -(logp.exp() * logp).sum(dim=-1)
            return (cp.gather(local, self.cp_size, self._group)[:, :-1] * mask).sum()
