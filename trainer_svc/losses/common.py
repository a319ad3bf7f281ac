"""Inputs and outputs shared by the loss functions (see the package docstring for layout)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's token-aligned [B, T-1] tensors besides the current logprobs.

    mask: 1.0 on trained completion tokens, 0.0 on prompt, masked-out and padding tokens.
    advantages: the sample's advantage on each of its tokens (0 where it is unused).
    prev_logprobs: the trainer's logprobs at the start of the step (before any update).
    generation_logprobs: the generator's logprobs of the sampled tokens.
    reference_logprobs: logprobs under the frozen reference policy.
    teacher_logprobs: logprobs under a distillation teacher (trainer_svc/losses/distillation.py).
    returns, old_values: a critic's targets and its values at rollout time (trainer_svc/losses/value.py).
    Tensors that a loss does not need may be None.
    """

    mask: torch.Tensor
    advantages: torch.Tensor
    prev_logprobs: torch.Tensor | None = None
    generation_logprobs: torch.Tensor | None = None
    reference_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None


@dataclass(frozen=True)
class LossOutput:
    """loss: scalar to backpropagate. metrics: detached scalars with the same global
    normalisation as the loss, so both are summed over micro-batches and ranks."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossFn:
    """A loss bound to its config, with what its inputs need computed beforehand (each loss's
    `build` function, registered in `trainer_svc.types.LOSSES`, makes one)."""

    compute: Callable[[torch.Tensor, LossInputs, float, float | None], LossOutput]
    needs_previous_logprobs: bool
    needs_reference_logprobs: bool
    needs_generation_logprobs: bool
    takes_sequence_scores: bool = False
    """True: the first argument is one score per sequence [B] (a sequence classifier's scalar
    head) instead of token logprobs [B, T-1]."""
    takes_token_values: bool = False
    """True: the first argument is a value model's scalar per token [B, T-1] (a critic; column j
    holds the value of the state of tokens 0..j, from which token j+1 is sampled) instead of
    token logprobs."""

    def __call__(self, curr_logprobs: torch.Tensor, inputs: LossInputs, num_global_tokens: float,
                 num_global_sequences: float | None = None) -> LossOutput:
        """num_global_sequences: `count_loss_sequences` of the step; sequence-level losses need it."""
        return self.compute(curr_logprobs, inputs, num_global_tokens, num_global_sequences)


def global_denominator(num_global_tokens: float) -> float:
    """Guards the all-masked batch (its loss is 0, not NaN)."""
    return max(float(num_global_tokens), 1.0)


def masked_entropy_sum(logits: torch.Tensor, mask: torch.Tensor, chunk_positions: int = 256) -> torch.Tensor:
    """Sum over masked positions of the entropy of softmax(logits) weighted by the mask; logits
    [B, T-1, V]. Only the masked-in positions are computed (a chunk of them at a time): at a
    151,936-word vocabulary every position costs a log-softmax, an exp and a product over V."""
    with torch.no_grad():
        rows, cols = torch.nonzero(mask, as_tuple=True)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i in range(0, rows.numel(), chunk_positions):
            r, c = rows[i:i + chunk_positions], cols[i:i + chunk_positions]
            logp = torch.log_softmax(logits[r, c].float(), dim=-1)
            entropy = -(logp.exp() * logp).sum(dim=-1)
            total += (entropy * mask[r, c].float()).sum()
        return total
