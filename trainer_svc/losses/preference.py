"""Losses over preference pairs: DPO (a causal LM against its frozen reference) and
Bradley-Terry (a scalar-head reward model).

Pair layout: rows come in (chosen, rejected) pairs, row 2k chosen and row 2k+1 rejected, in
every micro-batch (the engine checks that batch sizes keep pairs whole). Per-sequence inputs are
[B, T-1] token-aligned tensors (package docstring) or, for Bradley-Terry, one score per row [B].

DPO (NeMo-RL's DPOLossFn), per pair with beta = reference_policy_kl_penalty:
    r          = sum_t (curr - ref) * mask        (/ n_tokens with preference_average_log_probs)
    preference = -log sigmoid(beta * (r_chosen - r_rejected))
    sft        = -sum_t curr * mask of the chosen  (/ n_tokens with sft_average_log_probs)
    loss       = preference_loss_weight * preference + sft_loss_weight * sft
Bradley-Terry, per pair: loss = -log sigmoid(score_chosen - score_rejected).

Both reduce as sum over this micro-batch's pairs / num_global_pairs (the pairs of the whole
optimizer step on all ranks), so sums over micro-batches and ranks give the step's mean.
Metrics, reduced the same way: loss, accuracy (fraction of pairs with r_chosen > r_rejected;
ties count as wrong), rewards_chosen_mean, rewards_rejected_mean, reward_margin (mean of
r_chosen - r_rejected; DPO's r without beta, as NeMo-RL logs it), and for DPO preference_loss
and sft_loss.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from trainer_svc.losses.common import LossFn, LossInputs, LossOutput, global_denominator
from trainer_svc.types import BradleyTerryLossConfig, DpoLossConfig


def build_dpo(config: DpoLossConfig) -> LossFn:
    """The registered DPO loss (trainer_svc.types.LOSSES)."""
    return LossFn(partial(_dpo, config=config), needs_previous_logprobs=False, needs_reference_logprobs=True,
                  needs_generation_logprobs=False)


def build_bradley_terry(config: BradleyTerryLossConfig) -> LossFn:
    """The registered Bradley-Terry loss (trainer_svc.types.LOSSES): one score per sequence."""
    return LossFn(_bradley_terry, needs_previous_logprobs=False, needs_reference_logprobs=False,
                  needs_generation_logprobs=False, takes_sequence_scores=True)


def dpo_loss(curr_logprobs: torch.Tensor, *, reference_logprobs: torch.Tensor, mask: torch.Tensor,
             num_global_pairs: float, config: DpoLossConfig) -> LossOutput:
    """The DPO loss of one micro-batch of pairs; tensors [2P, T-1]."""
    _check_pairs(curr_logprobs)
    tokens = mask.sum(dim=-1).clamp(min=1)
    rewards = ((curr_logprobs - reference_logprobs.detach()) * mask).sum(dim=-1)
    if config.preference_average_log_probs:
        rewards = rewards / tokens
    delta = rewards[0::2] - rewards[1::2]
    pairs = global_denominator(num_global_pairs)
    preference = -F.logsigmoid(config.reference_policy_kl_penalty * delta).sum() / pairs
    nll = -(curr_logprobs * mask).sum(dim=-1)
    if config.sft_average_log_probs:
        nll = nll / tokens
    sft = nll[0::2].sum() / pairs
    loss = config.preference_loss_weight * preference + config.sft_loss_weight * sft
    metrics = _pair_metrics(rewards.detach(), pairs)
    metrics.update(loss=loss.detach(), preference_loss=preference.detach(), sft_loss=sft.detach())
    return LossOutput(loss, metrics)


def bradley_terry_loss(scores: torch.Tensor, *, num_global_pairs: float) -> LossOutput:
    """The Bradley-Terry loss of one micro-batch of pairs; scores [2P] (one scalar per sequence)."""
    _check_pairs(scores)
    scores = scores.float()
    pairs = global_denominator(num_global_pairs)
    loss = -F.logsigmoid(scores[0::2] - scores[1::2]).sum() / pairs
    metrics = _pair_metrics(scores.detach(), pairs)
    metrics["loss"] = loss.detach()
    return LossOutput(loss, metrics)


def _check_pairs(rows: torch.Tensor) -> None:
    assert rows.shape[0] % 2 == 0, f"a preference micro-batch has an even number of rows, got {rows.shape[0]}"


def _pair_metrics(rewards: torch.Tensor, pairs: float) -> dict[str, torch.Tensor]:
    chosen, rejected = rewards[0::2], rewards[1::2]
    return {
        "accuracy": (chosen > rejected).float().sum() / pairs,
        "rewards_chosen_mean": chosen.sum() / pairs,
        "rewards_rejected_mean": rejected.sum() / pairs,
        "reward_margin": (chosen - rejected).sum() / pairs,
    }


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
