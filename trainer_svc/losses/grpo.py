"""The GRPO clipped policy-gradient loss, with NeMo-RL's ClippedPGLossFn semantics.

Per completion token (all tensors [B, T-1], see the package docstring):
    ratio = exp(curr - prev)                       prev: the trainer's logprobs before the step
    pg    = max(-A * ratio, -A * clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max))
    pg   *= exp(prev - generation)  (detached)     if use_importance_sampling_correction
    k3    = exp(ref - curr) - (ref - curr) - 1     if reference_policy_kl_penalty > 0
    token_loss = pg + reference_policy_kl_penalty * k3
and loss = sum(token_loss * mask) / num_global_tokens.

Metrics (same normalisation): loss, pg_loss, kl (mean k3), clip_fraction (tokens whose
clipped term is the active one, i.e. the clip zeroes their ratio gradient), ratio_mean,
importance_weight_mean, token_mult_prob_error (mean exp(|prev - generation|); 1.0 on-policy).
kl is 0 when the penalty is 0: the reference logprobs are then not computed at all.
"""

from __future__ import annotations

import torch

from trainer_svc.losses.common import LossOutput, global_denominator
from trainer_svc.types import GrpoLossConfig


def grpo_loss(
    curr_logprobs: torch.Tensor,
    *,
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_global_tokens: float,
    config: GrpoLossConfig,
) -> LossOutput:
    """The clipped PG loss of one micro-batch, normalised by the global token count."""
    denom = global_denominator(num_global_tokens)
    prev = prev_logprobs.detach()
    ratio = torch.exp(curr_logprobs - prev)
    clamped = ratio.clamp(1.0 - config.ratio_clip_min, 1.0 + config.ratio_clip_max)
    unclipped_term = -advantages * ratio
    clipped_term = -advantages * clamped
    pg = torch.maximum(unclipped_term, clipped_term)
    importance = torch.exp(prev - generation_logprobs.detach())
    if config.use_importance_sampling_correction:
        pg = pg * importance
    token_loss = pg
    if config.reference_policy_kl_penalty > 0:
        if reference_logprobs is None:
            raise ValueError("reference_policy_kl_penalty > 0 needs reference logprobs")
        log_ref_ratio = reference_logprobs.detach() - curr_logprobs
        k3 = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
        token_loss = token_loss + config.reference_policy_kl_penalty * k3
    else:
        k3 = torch.zeros_like(curr_logprobs)
    loss = (token_loss * mask).sum() / denom

    def mean(x: torch.Tensor) -> torch.Tensor:
        return (x.detach() * mask).sum() / denom

    metrics = {
        "loss": loss.detach(),
        "pg_loss": mean(pg),
        "kl": mean(k3),
        "clip_fraction": mean((clipped_term > unclipped_term).to(mask.dtype)),
        "ratio_mean": mean(ratio),
        "importance_weight_mean": mean(importance),
        "token_mult_prob_error": mean(torch.exp((prev - generation_logprobs.detach()).abs())),
    }
    return LossOutput(loss, metrics)
