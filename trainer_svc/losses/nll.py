"""Negative log-likelihood of the completion tokens (SFT), globally token-normalised."""

from __future__ import annotations

import torch

from trainer_svc.losses.common import LossFn, LossInputs, LossOutput, global_denominator
from trainer_svc.types import NllLossConfig


def build(config: NllLossConfig) -> LossFn:
    """The registered NLL loss (trainer_svc.types.LOSSES)."""
    return LossFn(_nll, needs_previous_logprobs=False, needs_reference_logprobs=False,
                  needs_generation_logprobs=False)


def nll_loss(curr_logprobs: torch.Tensor, *, mask: torch.Tensor, num_global_tokens: float) -> LossOutput:
    """sum(-logprob * mask) / num_global_tokens; tensors [B, T-1]. Metric: loss."""
    loss = (-curr_logprobs * mask).sum() / global_denominator(num_global_tokens)
    return LossOutput(loss, {"loss": loss.detach()})


def _nll(curr: torch.Tensor, inputs: LossInputs, num_global_tokens: float, num_global_sequences: float | None) -> LossOutput:
    return nll_loss(curr, mask=inputs.mask, num_global_tokens=num_global_tokens)
