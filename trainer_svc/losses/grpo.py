"""The GRPO family's clipped policy-gradient loss, with NeMo-RL's ClippedPGLossFn semantics.

Per completion token (all tensors [B, T-1], see the package docstring; prev: the trainer's
logprobs before the step, gen: the generator's, ref: the frozen reference's):
    ratio = exp(curr - prev)                        (GSPO: exp(mean_t(curr - prev)) per sequence;
                                                     force_on_policy_ratio: 1 with live gradient;
                                                     disable_ppo_ratio: ratio := curr, i.e. -A*logp)
    pg    = max(-A * ratio, -A * clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max))
    pg    = min(pg, -A * ratio_clip_c)  where A < 0  (dual-clip, if ratio_clip_c is set)
    w     = exp(prev - gen)  (detached; per sequence exp(sum_t(prev - gen)) with GSPO ratios)
            truncated: tis -> min(w, R); icepop -> 0 where w outside [R_min, R];
            seq-mask-tis -> 0 on sequences whose exp(mean_t(prev - gen)) is outside [R_min, R]
    pg   *= w                                        if use_importance_sampling_correction
    kl    = k1 | k2 | k3 (tandem.kl, clamped)        if reference_policy_kl_penalty > 0
            (* exp(curr - gen), detached, with use_on_policy_kl_approximation)
    token_loss = pg + reference_policy_kl_penalty * kl

Reduction, both exact under any split into micro-batches and ranks (each piece is divided by a
count of the whole optimizer step):
    token_level_loss:     sum(token_loss * mask) / num_global_tokens
    sequence level:       sum_i [ sum_t(token_loss * mask)_i / n_i ] / num_global_sequences
where n_i is sequence i's masked-in token count and num_global_sequences counts the step's
sequences with n_i > 0.

Metrics (summed over pieces like the loss): loss, pg_loss, kl (mean estimate, unscaled) with the
loss's reduction; clip_fraction (tokens whose clipped term is active), ratio_mean,
importance_weight_mean (after truncation), token_mult_prob_error (mean exp(|prev - gen|)) per
token; with dual-clip dual_clip_fraction; with icepop / seq-mask-tis is_oob_ratio (fraction of
tokens / sequences masked out). kl is 0 when the penalty is 0 (no reference logprobs then).
"""

from __future__ import annotations

from functools import partial

import torch

from tandem.kl import kl_estimate
from trainer_svc.losses.common import LossFn, LossInputs, LossOutput, global_denominator
from trainer_svc.types import GrpoLossConfig


def build(config: GrpoLossConfig) -> LossFn:
    """The registered GRPO loss (trainer_svc.types.LOSSES)."""
    return LossFn(partial(_grpo, config=config), needs_previous_logprobs=True,
                  needs_reference_logprobs=config.reference_policy_kl_penalty > 0, needs_generation_logprobs=True)


def _grpo(curr: torch.Tensor, inputs: LossInputs, num_global_tokens: float, num_global_sequences: float | None, *,
          config: GrpoLossConfig) -> LossOutput:
    assert inputs.generation_logprobs is not None
    # No previous logprobs: the weights have not moved since the step began (its first optimizer
    # step, see `trainer_svc.losses.previous_logprobs_needed`), so they equal the current ones, detached.
    prev = curr.detach() if inputs.prev_logprobs is None else inputs.prev_logprobs
    return grpo_loss(curr, prev_logprobs=prev, generation_logprobs=inputs.generation_logprobs,
                     reference_logprobs=inputs.reference_logprobs, advantages=inputs.advantages, mask=inputs.mask,
                     num_global_tokens=num_global_tokens, num_global_sequences=num_global_sequences, config=config)


class _Reduction:
    """Sums over the masked-in tokens of a micro-batch, divided by counts of the whole step."""

    def __init__(self, mask: torch.Tensor, num_global_tokens: float, num_global_sequences: float | None,
                 token_level: bool):
        if not token_level and num_global_sequences is None:
            raise ValueError("token_level_loss: false needs num_global_sequences")
        self.mask, self.token_level = mask, token_level
        self.tokens = global_denominator(num_global_tokens)
        self.sequences = None if num_global_sequences is None else global_denominator(num_global_sequences)
        self.seq_tokens = mask.sum(dim=-1)  # n_i

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        # Masked positions (padding, tool observations) may hold any value, even inf (exp of a
        # very unlikely token's logprob gap): select instead of multiplying, so inf * 0 never
        # turns into NaN.
        return torch.where(self.mask > 0, x * self.mask, torch.zeros((), dtype=x.dtype))

    def token_mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.masked(x).sum() / self.tokens

    def seq_token_mean(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T-1] -> [B]: the mean over each row's masked-in tokens."""
        return self.masked(x).sum(dim=-1) / self.seq_tokens.clamp(min=1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The loss's reduction: token-level, or sequence-level (per-sequence mean, then over sequences)."""
        if self.token_level:
            return self.token_mean(x)
        return self.seq_token_mean(x).sum() / self.sequences


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
    num_global_sequences: float | None = None,
) -> LossOutput:
    """The clipped PG loss of one micro-batch, normalised by the step's global counts."""
    reduce = _Reduction(mask, num_global_tokens, num_global_sequences, config.token_level_loss)
    prev, gen = prev_logprobs.detach(), generation_logprobs.detach()
    ratio, clamped = _ratios(curr_logprobs, prev, mask, config)
    unclipped_term, clipped_term = -advantages * ratio, -advantages * clamped
    pg = torch.maximum(unclipped_term, clipped_term)
    metrics: dict[str, torch.Tensor] = {}
    if config.ratio_clip_c is not None:
        dual = -advantages * config.ratio_clip_c
        dual_active = (advantages < 0) & (dual < pg)
        pg = torch.where(dual_active, dual, pg)
        metrics["dual_clip_fraction"] = reduce.token_mean(dual_active.to(mask.dtype))

    weights, oob = _importance_weights(prev, gen, mask, config, reduce.seq_token_mean)
    if oob is not None:
        metrics["is_oob_ratio"] = (reduce.token_mean(oob) if config.truncated_importance_sampling_type == "icepop"
                                   else (oob[:, 0] * (reduce.seq_tokens > 0)).sum() / reduce.sequences)
    if config.use_importance_sampling_correction:
        pg = pg * weights
    kl = _kl(curr_logprobs, gen, reference_logprobs, config)
    loss = reduce(pg + config.reference_policy_kl_penalty * kl)

    with torch.no_grad():
        metrics.update({
            "loss": loss.detach(),
            "pg_loss": reduce(pg.detach()),
            "kl": reduce(kl.detach()),
            "clip_fraction": reduce.token_mean((clipped_term > unclipped_term).to(mask.dtype)),
            "ratio_mean": reduce.token_mean(ratio.detach()),
            "importance_weight_mean": reduce.token_mean(weights.expand_as(mask)),
            "token_mult_prob_error": reduce.token_mean(torch.exp((prev - gen).abs())),
        })
    return LossOutput(loss, metrics)


def _kl(curr: torch.Tensor, gen: torch.Tensor, reference: torch.Tensor | None, config: GrpoLossConfig) -> torch.Tensor:
    """The per-token KL estimate to the reference ([B, T-1]); zeros when the penalty is 0."""
    if not config.reference_policy_kl_penalty > 0:
        return torch.zeros_like(curr)
    if reference is None:
        raise ValueError("reference_policy_kl_penalty > 0 needs reference logprobs")
    kl = kl_estimate(curr, reference.detach(), config.reference_policy_kl_type,
                     input_clamp=config.kl_input_clamp_value, output_clamp=config.kl_output_clamp_value)
    if config.use_on_policy_kl_approximation:
        kl = kl * torch.nan_to_num(torch.exp(curr.detach() - gen), nan=0.0, posinf=0.0, neginf=0.0)
    return kl


def _ratios(curr: torch.Tensor, prev: torch.Tensor, mask: torch.Tensor,
            config: GrpoLossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(ratio, clamped ratio), both [B, T-1]."""
    if config.force_on_policy_ratio:
        ratio = torch.exp(curr - curr.detach())
        return ratio, ratio
    if config.disable_ppo_ratio:
        return curr, curr
    log_ratio = curr - prev
    if config.sequence_level_importance_ratios:
        seq_mean = (log_ratio * mask).sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
        ratio = torch.exp(seq_mean).expand_as(curr)
    else:
        ratio = torch.exp(log_ratio)
    return ratio, ratio.clamp(1.0 - config.ratio_clip_min, 1.0 + config.ratio_clip_max)


def _importance_weights(prev: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor, config: GrpoLossConfig,
                        seq_token_mean) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Detached weights ([B, T-1], or [B, 1] with GSPO ratios) and, for the masking modes, the
    out-of-range indicator ([B, T-1] for icepop, [B, 1] for seq-mask-tis; None otherwise)."""
    log_w = torch.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0)
    if config.sequence_level_importance_ratios:
        weights = torch.exp((log_w * mask).sum(dim=-1, keepdim=True))
    else:
        weights = torch.exp(log_w)
    weights = torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)
    high = config.truncated_importance_sampling_ratio
    if high is None:
        return weights, None
    low = config.truncated_importance_sampling_ratio_min
    match config.truncated_importance_sampling_type:
        case "tis":
            return weights.clamp(max=high), None
        case "icepop":
            keep = (weights >= low) & (weights <= high)
            return torch.where(keep, weights, torch.zeros_like(weights)), (~keep).to(mask.dtype)
        case "seq-mask-tis":
            geo_mean = torch.exp(seq_token_mean(log_w)).unsqueeze(-1)  # [B, 1]
            keep = (geo_mean >= low) & (geo_mean <= high)
            return weights * keep.to(weights.dtype), (~keep).to(mask.dtype)
    raise ValueError(f"unknown truncated_importance_sampling_type {config.truncated_importance_sampling_type!r}")
