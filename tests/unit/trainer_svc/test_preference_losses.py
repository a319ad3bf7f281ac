"""DPO and Bradley-Terry losses against hand-computed values, and their split invariance."""

import math

import pytest
import torch

from trainer_svc.losses import LossInputs, bradley_terry_loss, build_loss_fn, dpo_loss
from trainer_svc.types import BradleyTerryLossConfig, DpoLossConfig


def _softplus(x: float) -> float:  # log(1 + e^x); -log sigmoid(z) = softplus(-z)
    return math.log1p(math.exp(x))


def _pair_batch():
    """One pair: chosen has 2 completion tokens, rejected 1 (the rest is padding/prompt)."""
    curr = torch.tensor([[-1.0, -0.5, -9.0], [-2.0, -7.0, -7.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -3.0], [-1.0, -3.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    return curr, ref, mask


def test_dpo_summed_log_ratios():
    curr, ref, mask = _pair_batch()
    beta = 0.5
    out = dpo_loss(curr, reference_logprobs=ref, mask=mask, num_global_pairs=1,
                   config=DpoLossConfig(reference_policy_kl_penalty=beta))
    r_chosen = (-1.0 + 1.5) + (-0.5 + 1.0)  # 1.0
    r_rejected = -2.0 + 1.0  # -1.0
    expected = _softplus(-beta * (r_chosen - r_rejected))
    assert out.loss.item() == pytest.approx(expected)
    assert out.metrics["preference_loss"].item() == pytest.approx(expected)
    assert out.metrics["sft_loss"].item() == pytest.approx(1.5)  # reported even with weight 0
    assert out.metrics["accuracy"].item() == 1.0
    assert out.metrics["rewards_chosen_mean"].item() == pytest.approx(1.0)
    assert out.metrics["rewards_rejected_mean"].item() == pytest.approx(-1.0)
    assert out.metrics["reward_margin"].item() == pytest.approx(2.0)
    out.loss.backward()
    # d/d r_c of softplus(-beta*delta) = -beta * sigmoid(-beta*delta); each masked chosen token gets it
    g = -beta / (1 + math.exp(beta * 2.0))
    assert curr.grad.tolist() == [pytest.approx([g, g, 0.0]), pytest.approx([-g, 0.0, 0.0])]


def test_dpo_averaged_log_ratios_and_sft_term():
    curr, ref, mask = _pair_batch()
    cfg = DpoLossConfig(reference_policy_kl_penalty=1.0, preference_loss_weight=0.5, sft_loss_weight=2.0,
                        preference_average_log_probs=True, sft_average_log_probs=True)
    out = dpo_loss(curr, reference_logprobs=ref, mask=mask, num_global_pairs=1, config=cfg)
    r_chosen, r_rejected = 1.0 / 2, -1.0 / 1
    preference = _softplus(-(r_chosen - r_rejected))
    sft = (1.0 + 0.5) / 2  # chosen's token-mean NLL
    assert out.metrics["preference_loss"].item() == pytest.approx(preference)
    assert out.metrics["sft_loss"].item() == pytest.approx(sft)
    assert out.loss.item() == pytest.approx(0.5 * preference + 2.0 * sft)


def test_dpo_wrong_preference_counts_as_inaccurate_and_ties_too():
    ref = torch.zeros(4, 2)
    curr = torch.tensor([[-2.0, 0.0], [-1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0]] * 4)
    out = dpo_loss(curr, reference_logprobs=ref, mask=mask, num_global_pairs=2, config=DpoLossConfig())
    # pair 1: r_c = -2 < r_r = -1 (wrong); pair 2: tie (wrong)
    assert out.metrics["accuracy"].item() == 0.0
    assert out.metrics["reward_margin"].item() == pytest.approx((-1.0 + 0.0) / 2)
    assert out.loss.item() == pytest.approx((_softplus(0.05) + _softplus(0.0)) / 2)


def test_dpo_normalises_by_the_global_pair_count_so_splits_add_up():
    torch.manual_seed(0)
    curr = torch.randn(8, 5)
    ref = torch.randn(8, 5)
    mask = (torch.rand(8, 5) > 0.3).float()
    mask[:, 0] = 1.0
    cfg = DpoLossConfig(reference_policy_kl_penalty=0.3, sft_loss_weight=0.7)
    whole = dpo_loss(curr, reference_logprobs=ref, mask=mask, num_global_pairs=4, config=cfg)
    halves = [dpo_loss(curr[i:i + 4], reference_logprobs=ref[i:i + 4], mask=mask[i:i + 4], num_global_pairs=4,
                       config=cfg) for i in (0, 4)]
    for name in whole.metrics:
        assert sum(h.metrics[name].item() for h in halves) == pytest.approx(whole.metrics[name].item()), name


def test_bradley_terry_against_hand_values():
    scores = torch.tensor([2.0, 0.5, -1.0, 1.0], requires_grad=True)
    out = bradley_terry_loss(scores, num_global_pairs=2)
    assert out.loss.item() == pytest.approx((_softplus(-1.5) + _softplus(2.0)) / 2)
    assert out.metrics["accuracy"].item() == pytest.approx(0.5)
    assert out.metrics["rewards_chosen_mean"].item() == pytest.approx(0.5)
    assert out.metrics["rewards_rejected_mean"].item() == pytest.approx(0.75)
    assert out.metrics["reward_margin"].item() == pytest.approx((1.5 - 2.0) / 2)
    out.loss.backward()
    g1 = -1 / (1 + math.exp(1.5)) / 2  # d/ds_c of softplus(-(s_c - s_r)) / 2
    g2 = -1 / (1 + math.exp(-2.0)) / 2
    assert scores.grad.tolist() == pytest.approx([g1, -g1, g2, -g2])


def test_build_loss_fn_declares_what_preference_losses_need():
    dpo = build_loss_fn(DpoLossConfig())
    assert dpo.needs_reference_logprobs and not dpo.needs_previous_logprobs and not dpo.takes_sequence_scores
    bt = build_loss_fn(BradleyTerryLossConfig())
    assert bt.takes_sequence_scores and not bt.needs_reference_logprobs
    out = bt(torch.tensor([1.0, 0.0]), LossInputs(torch.ones(2, 1), torch.zeros(2, 1)), 2.0, 2.0)
    assert out.loss.item() == pytest.approx(_softplus(-1.0))  # 2 sequences = 1 pair


@pytest.mark.parametrize("kwargs, message", [
    ({"reference_policy_kl_penalty": 0.0}, "reference_policy_kl_penalty"),
    ({"sft_loss_weight": -1.0}, "sft_loss_weight"),
    ({"preference_loss_weight": 0.0}, "nothing to train"),
])
def test_dpo_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DpoLossConfig(**kwargs)
