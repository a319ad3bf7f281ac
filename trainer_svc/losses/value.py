"""PPO's critic loss: the clipped squared error of a value model (a scalar per token) against
the returns of GAE (coordinator/loop/gae.py).

Per completion token (tensors [B, T-1], see the package docstring; v: the critic's current
value of the state the token is sampled from, v_old: its value when the batch was rolled out,
R: the return):

    v_clipped  = v_old + clamp(v - v_old, -cliprange_value, cliprange_value)
    token_loss = 0.5 * max((v - R)^2, (v_clipped - R)^2)          (cliprange_value null: 0.5 (v - R)^2)

token-mean over the step (sum(token_loss * mask) / num_global_tokens). The clip keeps one
update from moving a value far from the one the advantages were computed with, as PPO's ratio
clip does for the policy.

Metrics (summed over pieces like the loss): value_loss, value_clip_fraction (tokens whose
clipped error is the larger), value_mean (the current values), return_mean.
"""

from __future__ import annotations

from functools import partial

import torch

from trainer_svc.losses.common import LossFn, LossInputs, LossOutput, global_denominator
from trainer_svc.types import ValueLossConfig


def build(config: ValueLossConfig) -> LossFn:
    """The registered value loss (trainer_svc.types.LOSSES)."""
    return LossFn(partial(_value, config=config), needs_previous_logprobs=False, needs_reference_logprobs=False,
                  needs_generation_logprobs=False, takes_token_values=True)


def _value(values: torch.Tensor, inputs: LossInputs, num_global_tokens: float, num_global_sequences: float | None,
           *, config: ValueLossConfig) -> LossOutput:
    if inputs.returns is None or inputs.old_values is None:
        raise ValueError("the value loss needs returns and old values on every sample")
    return value_loss(values, old_values=inputs.old_values, returns=inputs.returns, mask=inputs.mask,
                      num_global_tokens=num_global_tokens, cliprange_value=config.cliprange_value)


def value_loss(values: torch.Tensor, *, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               num_global_tokens: float, cliprange_value: float | None) -> LossOutput:
    """The loss of one micro-batch, normalised by the step's masked-in token count."""
    inside = mask > 0
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    error = (values - returns).square()
    if cliprange_value is None:
        worst, clipped_larger = error, torch.zeros_like(error, dtype=torch.bool)
    else:
        clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
        clipped_error = (clipped - returns).square()
        worst, clipped_larger = torch.maximum(error, clipped_error), clipped_error > error
    tokens = global_denominator(num_global_tokens)
    loss = torch.where(inside, 0.5 * worst * mask, zero).sum() / tokens
    with torch.no_grad():
        metrics = {"value_loss": loss.detach(),
                   "value_clip_fraction": torch.where(inside, clipped_larger.to(values.dtype), zero).sum() / tokens,
                   "value_mean": torch.where(inside, values.detach(), zero).sum() / tokens,
                   "return_mean": torch.where(inside, returns, zero).sum() / tokens}
    return LossOutput(loss, metrics)
