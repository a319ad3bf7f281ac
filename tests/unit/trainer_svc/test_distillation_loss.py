"""The on-policy distillation loss (trainer_svc/losses/distillation.py) against values computed
by hand: per-token advantages task_reward_coef * A - kl_penalty_coef * (prev - teacher), GRPO's
clipped term on them, the reverse-KL metric, and masked teacher logprobs never read."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_svc.losses import LossInputs, build_loss_fn
from trainer_svc.losses.distillation import distillation_advantages
from trainer_svc.types import DistillationLossConfig

# One sequence, three token columns; column 0 is the prompt's (masked out).
MASK = torch.tensor([[0.0, 1.0, 1.0]])
CURR = [-0.5, -1.0, -2.0]
# Column 0's teacher value is garbage on purpose: masked columns must not be read.
TEACHER = torch.tensor([[float("nan"), -0.5, -3.0]])
ADVANTAGE = torch.tensor([[0.5, 0.5, 0.5]])


def _loss(config: DistillationLossConfig, curr: list[float], *, prev: list[float] | None = None,
          gen: list[float] | None = None):
    curr_t = torch.tensor([curr], requires_grad=True)
    inputs = LossInputs(MASK, ADVANTAGE, prev_logprobs=None if prev is None else torch.tensor([prev]),
                        generation_logprobs=torch.tensor([gen or curr]), teacher_logprobs=TEACHER)
    out = build_loss_fn(config)(curr_t, inputs, num_global_tokens=2.0)
    out.loss.backward()
    return out, curr_t.grad


def test_per_token_advantages_by_hand():
    # token 1: rkl = -1.0 - (-0.5) = -0.5 -> 0.2 * 0.5 + 0.5 = 0.6; token 2: rkl = -2 + 3 = 1 -> 0.1 - 1 = -0.9
    got = distillation_advantages(torch.tensor([CURR]), TEACHER, ADVANTAGE, MASK, kl_penalty_coef=1.0,
                                  task_reward_coef=0.2)
    assert got[0].tolist() == pytest.approx([0.0, 0.6, -0.9])
    scaled = distillation_advantages(torch.tensor([CURR]), TEACHER, ADVANTAGE, MASK, kl_penalty_coef=2.0,
                                     task_reward_coef=0.0)
    assert scaled[0].tolist() == pytest.approx([0.0, 1.0, -2.0])


def test_on_policy_loss_gradient_and_metrics_by_hand():
    out, grad = _loss(DistillationLossConfig(kl_penalty_coef=1.0, task_reward_coef=0.2), CURR)
    # ratio 1, weight 1: loss = mean(-A_t) = (-0.6 + 0.9) / 2; d loss / d curr_t = -A_t / 2
    assert float(out.loss.detach()) == pytest.approx(0.15)
    assert grad[0].tolist() == pytest.approx([0.0, -0.3, 0.45])
    assert float(out.metrics["reverse_kl"]) == pytest.approx((-0.5 + 1.0) / 2)
    assert float(out.metrics["advantage_mean"]) == pytest.approx((0.6 - 0.9) / 2)
    assert "kl" not in out.metrics and float(out.metrics["token_mult_prob_error"]) == pytest.approx(1.0)


def test_pure_distillation_ignores_the_task_advantage():
    out, _ = _loss(DistillationLossConfig(kl_penalty_coef=1.0), CURR)
    assert float(out.loss.detach()) == pytest.approx((-0.5 + 1.0) / 2)  # mean(kl * rkl): A_t = -rkl


def test_clipping_and_importance_weight_by_hand():
    prev = [-0.5, -1.0 - math.log(1.5), -2.0]  # token 1's ratio curr/prev = 1.5, clipped to 1.2 (A > 0)
    gen = [-0.5, prev[1], -2.0 - math.log(2.0)]  # token 2's weight exp(prev - gen) = 2
    out, grad = _loss(DistillationLossConfig(kl_penalty_coef=1.0, task_reward_coef=0.2), CURR, prev=prev, gen=gen)
    a1 = 0.1 - (prev[1] + 0.5)  # advantages use prev, the student before the step
    a2 = 0.1 - 1.0
    term1 = max(-a1 * 1.5, -a1 * 1.2)  # = -a1 * 1.2: clipped, no gradient
    term2 = -a2 * 1.0 * 2.0
    assert float(out.loss.detach()) == pytest.approx((term1 + term2) / 2)
    assert grad[0].tolist() == pytest.approx([0.0, 0.0, -a2 * 2.0 / 2])
    assert float(out.metrics["clip_fraction"]) == pytest.approx(0.5)


def test_missing_teacher_logprobs_is_an_error():
    loss_fn = build_loss_fn(DistillationLossConfig())
    inputs = LossInputs(MASK, ADVANTAGE, generation_logprobs=torch.tensor([CURR]))
    with pytest.raises(ValueError, match="teacher_logprobs"):
        loss_fn(torch.tensor([CURR]), inputs, 2.0)
