"""On-policy distillation: the student samples, a teacher scores the student's tokens, and the
student is trained to lower its reverse KL to the teacher, KL(student || teacher).

Per completion token t (tensors [B, T-1], see the package docstring; prev: the trainer's logprob
of the sampled token before the step, teacher: the teacher's logprob of the same token given the
same prefix, A: the sample's task-reward advantage):

    reverse_kl_t = prev_t - teacher_t
    advantage_t  = task_reward_coef * A - kl_penalty_coef * reverse_kl_t        (detached)
    token_loss   = GRPO's clipped policy-gradient term with advantage_t          (trainer_svc/losses/grpo.py:
                   ratio exp(curr - prev) clipped to [1 - ratio_clip_min, 1 + ratio_clip_max], weighted by
                   exp(prev - gen) with use_importance_sampling_correction), token-mean over the step

Since the student sampled the tokens, E_t[prev_t - teacher_t] is the reverse KL at each position
(the sampled-token, k1 estimate), and the policy gradient with -reverse_kl_t as the per-token
reward-to-go of that token alone is its gradient up to the dependence of later positions on this
token: the per-token estimator of on-policy distillation. Teacher logprobs of masked-out tokens
(tool observations, padding) are never read.

Metrics: GRPO's, plus reverse_kl (token mean of prev - teacher, unscaled: the falling curve a
distillation run watches) and advantage_mean.
"""

from __future__ import annotations

from functools import partial

import torch

from trainer_svc.losses.common import LossFn, LossInputs, LossOutput, global_denominator
from trainer_svc.losses.grpo import grpo_loss
from trainer_svc.types import DistillationLossConfig, GrpoLossConfig


def build(config: DistillationLossConfig) -> LossFn:
    """The registered distillation loss (trainer_svc.types.LOSSES)."""
    return LossFn(partial(_distillation, config=config), needs_previous_logprobs=True,
                  needs_reference_logprobs=False, needs_generation_logprobs=True)


def _distillation(curr: torch.Tensor, inputs: LossInputs, num_global_tokens: float,
                  num_global_sequences: float | None, *, config: DistillationLossConfig) -> LossOutput:
    if inputs.teacher_logprobs is None or inputs.generation_logprobs is None:
        raise ValueError("the distillation loss needs teacher_logprobs and generation_logprobs on every sample")
    # As in GRPO: no previous logprobs means the weights have not moved since the step began.
    prev = curr.detach() if inputs.prev_logprobs is None else inputs.prev_logprobs
    return distillation_loss(curr, prev_logprobs=prev, generation_logprobs=inputs.generation_logprobs,
                             teacher_logprobs=inputs.teacher_logprobs, advantages=inputs.advantages,
                             mask=inputs.mask, num_global_tokens=num_global_tokens, config=config)


def distillation_advantages(prev_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, advantages: torch.Tensor,
                            mask: torch.Tensor, *, kl_penalty_coef: float, task_reward_coef: float) -> torch.Tensor:
    """[B, T-1] per-token advantages: task_reward_coef * A - kl_penalty_coef * (prev - teacher),
    detached, 0 where the mask is 0 (a masked teacher logprob may hold anything)."""
    reverse_kl = prev_logprobs.detach() - teacher_logprobs.detach()
    per_token = task_reward_coef * advantages - kl_penalty_coef * reverse_kl
    return torch.where(mask > 0, per_token, torch.zeros((), dtype=per_token.dtype))


def distillation_loss(curr_logprobs: torch.Tensor, *, prev_logprobs: torch.Tensor, generation_logprobs: torch.Tensor,
                      teacher_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      num_global_tokens: float, config: DistillationLossConfig) -> LossOutput:
    """The loss of one micro-batch, normalised by the step's masked-in token count."""
    per_token = distillation_advantages(prev_logprobs, teacher_logprobs, advantages, mask,
                                        kl_penalty_coef=config.kl_penalty_coef,
                                        task_reward_coef=config.task_reward_coef)
    policy_gradient = GrpoLossConfig(ratio_clip_min=config.ratio_clip_min, ratio_clip_max=config.ratio_clip_max,
                                     use_importance_sampling_correction=config.use_importance_sampling_correction)
    out = grpo_loss(curr_logprobs, prev_logprobs=prev_logprobs, generation_logprobs=generation_logprobs,
                    reference_logprobs=None, advantages=per_token, mask=mask, num_global_tokens=num_global_tokens,
                    config=policy_gradient)
    with torch.no_grad():
        tokens = global_denominator(num_global_tokens)
        reverse_kl = torch.where(mask > 0, (prev_logprobs - teacher_logprobs) * mask,
                                 torch.zeros((), dtype=mask.dtype))
        metrics = {**out.metrics, "reverse_kl": reverse_kl.sum() / tokens,
                   "advantage_mean": (per_token * mask).sum() / tokens}
        del metrics["kl"]  # GRPO's KL to a reference: there is none here
    return LossOutput(out.loss, metrics)
