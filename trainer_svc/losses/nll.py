"""Negative log-likelihood of the completion tokens (SFT), globally token-normalised."""

from __future__ import annotations

import torch

from trainer_svc.losses.common import LossOutput, global_denominator


def nll_loss(curr_logprobs: torch.Tensor, *, mask: torch.Tensor, num_global_tokens: float) -> LossOutput:
    """sum(-logprob * mask) / num_global_tokens; tensors [B, T-1]. Metric: loss."""
    loss = (-curr_logprobs * mask).sum() / global_denominator(num_global_tokens)
    return LossOutput(loss, {"loss": loss.detach()})
