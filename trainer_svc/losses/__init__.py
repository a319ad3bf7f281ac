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

`build_loss_fn` dispatches once, through the loss registry (`trainer_svc.types.LOSSES`: each
loss's `build` function in its own module); nothing downstream inspects the config's type.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module

from trainer_svc.losses.common import LossFn, LossInputs, LossOutput, masked_entropy_sum
from trainer_svc.losses.grpo import grpo_loss
from trainer_svc.losses.nll import nll_loss
from trainer_svc.losses.preference import bradley_terry_loss, dpo_loss
from trainer_svc.types import LossConfig, Sample, loss_kind

__all__ = ["LossFn", "LossInputs", "LossOutput", "bradley_terry_loss", "build_loss_fn", "count_loss_sequences",
           "dpo_loss", "grpo_loss", "nll_loss", "masked_entropy_sum", "previous_logprobs_needed"]


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
    """The loss for `config`: its registered kind's `build` function; ValueError for an unregistered config."""
    module, function = loss_kind(config).build.split(":")
    return getattr(import_module(module), function)(config)
