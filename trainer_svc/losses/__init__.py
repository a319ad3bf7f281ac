"""Loss functions of the trainer: pure functions over token-aligned tensors.

Layout of every tensor argument: [B, T-1] for a right-padded micro-batch of B sequences of
padded length T; column j holds the quantity of token j+1 (the token predicted from the
prefix 0..j). `mask` is 1 exactly on the completion tokens that are trained on.

Normalisation is global: a micro-batch returns sum(token_loss * mask) / num_global_tokens,
where num_global_tokens counts the masked-in tokens of the whole optimizer step on all
ranks (or, for GRPO's `token_level_loss: false`, the sum of per-sequence token means divided
by num_global_sequences, the step's sequences with at least one masked-in token; see
`count_loss_sequences`). Summing micro-batch losses (and gradients) over micro-batches and
ranks therefore gives the mean of the whole global batch, however it is split. Metrics use
the same normalisation, so they are summed the same way.

Preference losses (DPO, Bradley-Terry; `trainer_svc.losses.preference`) take rows in (chosen,
rejected) pairs and normalise by the step's pairs, num_global_sequences / 2. Bradley-Terry
takes one score per sequence ([B], a scalar-head model's output) instead of token logprobs
(`LossFn.takes_sequence_scores`).

`build_loss_fn` dispatches once on the loss config type; nothing downstream inspects it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from trainer_svc.losses.common import LossInputs, LossOutput, masked_entropy_sum
from trainer_svc.losses.grpo import grpo_loss
from trainer_svc.losses.nll import nll_loss
from trainer_svc.losses.preference import bradley_terry_loss, dpo_loss
from trainer_svc.types import (
    BradleyTerryLossConfig,
    DpoLossConfig,
    GrpoLossConfig,
    LossConfig,
    NllLossConfig,
    Sample,
)

__all__ = ["LossFn", "LossInputs", "LossOutput", "bradley_terry_loss", "build_loss_fn", "count_loss_sequences",
           "dpo_loss", "grpo_loss", "nll_loss", "masked_entropy_sum", "previous_logprobs_needed"]


@dataclass(frozen=True)
class LossFn:
    """A loss bound to its config, with what its inputs need computed beforehand."""

    compute: Callable[[torch.Tensor, LossInputs, float, float | None], LossOutput]
    needs_previous_logprobs: bool
    needs_reference_logprobs: bool
    needs_generation_logprobs: bool
    takes_sequence_scores: bool = False
    """True: the first argument is one score per sequence [B] (a sequence classifier's scalar
    head) instead of token logprobs [B, T-1]."""

    def __call__(self, curr_logprobs: torch.Tensor, inputs: LossInputs, num_global_tokens: float,
                 num_global_sequences: float | None = None) -> LossOutput:
        """num_global_sequences: `count_loss_sequences` of the step; sequence-level losses need it."""
        return self.compute(curr_logprobs, inputs, num_global_tokens, num_global_sequences)


def previous_logprobs_needed(loss_fn: LossFn, optimizer_step: int, dropout_free: bool) -> bool:
    """Whether optimizer step `optimizer_step` (0-based) of a TrainStep needs a pass that scores its
    micro-batches under the weights before it. The first needs none when the model has no active
    dropout: its weights are the step's starting weights, so the training forward's logprobs are
    the previous ones (the same micro-batches, the same shapes, the same kernels). Later steps run
    on moved weights and need the pass. (On-policy GRPO with one optimizer step per TrainStep runs
    two forward passes instead of three.)"""
    return loss_fn.needs_previous_logprobs and (optimizer_step > 0 or not dropout_free)


def count_loss_sequences(samples: Sequence[Sample]) -> int:
    """Samples with at least one masked-in completion token: the sequence-level normaliser."""
    return sum(1 for s in samples if s.completion_length > 0 and (s.loss_mask is None or any(m > 0 for m in s.loss_mask)))


def build_loss_fn(config: LossConfig) -> LossFn:
    """The loss for `config` (GrpoLossConfig or NllLossConfig)."""
    match config:
        case GrpoLossConfig():
            return LossFn(partial(_grpo, config=config), needs_previous_logprobs=True,
                          needs_reference_logprobs=config.reference_policy_kl_penalty > 0,
                          needs_generation_logprobs=True)
        case NllLossConfig():
            return LossFn(_nll, needs_previous_logprobs=False, needs_reference_logprobs=False,
                          needs_generation_logprobs=False)
        case DpoLossConfig():
            return LossFn(partial(_dpo, config=config), needs_previous_logprobs=False,
                          needs_reference_logprobs=True, needs_generation_logprobs=False)
        case BradleyTerryLossConfig():
            return LossFn(_bradley_terry, needs_previous_logprobs=False, needs_reference_logprobs=False,
                          needs_generation_logprobs=False, takes_sequence_scores=True)
    raise TypeError(f"unknown loss config {type(config).__name__}")


def _grpo(curr: torch.Tensor, inputs: LossInputs, num_global_tokens: float, num_global_sequences: float | None, *,
          config: GrpoLossConfig) -> LossOutput:
    assert inputs.generation_logprobs is not None
    # No previous logprobs: the weights have not moved since the step began (its first optimizer
    # step, see `previous_logprobs_needed`), so they equal the current ones, detached.
    prev = curr.detach() if inputs.prev_logprobs is None else inputs.prev_logprobs
    return grpo_loss(curr, prev_logprobs=prev, generation_logprobs=inputs.generation_logprobs,
                     reference_logprobs=inputs.reference_logprobs, advantages=inputs.advantages, mask=inputs.mask,
                     num_global_tokens=num_global_tokens, num_global_sequences=num_global_sequences, config=config)


def _nll(curr: torch.Tensor, inputs: LossInputs, num_global_tokens: float, num_global_sequences: float | None) -> LossOutput:
    return nll_loss(curr, mask=inputs.mask, num_global_tokens=num_global_tokens)


def _pairs(num_global_sequences: float | None) -> float:
    assert num_global_sequences is not None, "preference losses need the step's sequence count"
    return num_global_sequences / 2


def _dpo(curr: torch.Tensor, inputs: LossInputs, num_global_tokens: float, num_global_sequences: float | None, *,
         config: DpoLossConfig) -> LossOutput:
    assert inputs.reference_logprobs is not None
    return dpo_loss(curr, reference_logprobs=inputs.reference_logprobs, mask=inputs.mask,
                    num_global_pairs=_pairs(num_global_sequences), config=config)


def _bradley_terry(scores: torch.Tensor, inputs: LossInputs, num_global_tokens: float,
                   num_global_sequences: float | None) -> LossOutput:
    return bradley_terry_loss(scores, num_global_pairs=_pairs(num_global_sequences))
