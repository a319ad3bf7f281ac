"""PPO's clipped value loss (trainer_svc/losses/value.py) against hand-computed values."""

import pytest
import torch

from trainer_svc.losses import LossInputs, build_loss_fn
from trainer_svc.losses.value import value_loss
from trainer_svc.types import ValueLossConfig, loss_kind

# Two masked-in tokens and a masked-out one (its values are never read), in a step of 4 tokens:
#   t0: v 0.5, v_old 0, R 1: error (0.5-1)^2 = 0.25; clipped v = 0 + clamp(0.5, +-0.2) = 0.2,
#       its error (0.2-1)^2 = 0.64 -> max 0.64 (the clipped one, whose gradient in v is 0)
#   t1: v 1.0, v_old 0, R 0: error 1.0; clipped v 0.2, error 0.04 -> max 1.0 (gradient 2 (v - R) = 2)
#   loss = 0.5 * (0.64 + 1.0) / 4 = 0.205; clip fraction 1/4; value mean 1.5/4; return mean 1/4
VALUES = [[0.5, 1.0, 9.0]]
OLD = [[0.0, 0.0, -9.0]]
RETURNS = [[1.0, 0.0, 5.0]]
MASK = [[1.0, 1.0, 0.0]]


def _run(cliprange):
    values = torch.tensor(VALUES, requires_grad=True)
    out = value_loss(values, old_values=torch.tensor(OLD), returns=torch.tensor(RETURNS), mask=torch.tensor(MASK),
                     num_global_tokens=4, cliprange_value=cliprange)
    out.loss.backward()
    return out, values.grad


def test_clipped_value_loss_against_hand_computed_values():
    out, grad = _run(0.2)
    assert out.loss.item() == pytest.approx(0.205)
    assert out.metrics["value_clip_fraction"].item() == pytest.approx(0.25)
    assert out.metrics["value_mean"].item() == pytest.approx(0.375)
    assert out.metrics["return_mean"].item() == pytest.approx(0.25)
    # d/dv of 0.5 * max(...) / 4: t0's clipped branch is flat (0), t1: 0.5 * 2 * (1 - 0) / 4 = 0.25, t2 masked
    assert grad[0].tolist() == pytest.approx([0.0, 0.25, 0.0])


def test_unclipped_value_loss():
    # 0.5 * (0.25 + 1.0) / 4 = 0.15625; gradients 0.5 * 2 * (v - R) / 4: t0 -0.125, t1 0.25
    out, grad = _run(None)
    assert out.loss.item() == pytest.approx(0.15625)
    assert out.metrics["value_clip_fraction"].item() == 0.0
    assert grad[0].tolist() == pytest.approx([-0.125, 0.25, 0.0])


def test_registered_value_loss_reads_returns_and_old_values():
    fn = build_loss_fn(ValueLossConfig(cliprange_value=0.2))
    assert fn.takes_token_values and not fn.needs_previous_logprobs and loss_kind(ValueLossConfig()).value_model
    inputs = LossInputs(torch.tensor(MASK), torch.zeros(1, 3), returns=torch.tensor(RETURNS),
                        old_values=torch.tensor(OLD))
    assert fn(torch.tensor(VALUES), inputs, 4).loss.item() == pytest.approx(0.205)
    with pytest.raises(ValueError, match="returns and old values"):
        fn(torch.tensor(VALUES), LossInputs(torch.tensor(MASK), torch.zeros(1, 3)), 4)


def test_cliprange_value_must_be_positive():
    with pytest.raises(ValueError):
        ValueLossConfig(cliprange_value=0.0)
