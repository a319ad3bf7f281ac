"""The GRPO loss variants (dual-clip, sequence-level normalisation, GSPO, truncated IS, KL
estimators, REINFORCE) against hand-computed values, their split invariance, the config
checks, and the proto round trip of the loss config."""

import math

import pytest
import torch

from tandem.kl import kl_estimate
from trainer_svc.client import _train_request
from trainer_svc.losses import LossInputs, build_loss_fn, grpo_loss
from trainer_svc.server import _loss as loss_from_request
from trainer_svc.types import GrpoLossConfig

LN = math.log


def _loss(curr, adv, mask=None, prev=None, gen=None, ref=None, n_tok=None, n_seq=None, **cfg):
    mask = torch.ones_like(curr) if mask is None else mask
    prev = torch.zeros_like(curr) if prev is None else prev
    gen = prev if gen is None else gen
    return grpo_loss(curr, prev_logprobs=prev, generation_logprobs=gen, reference_logprobs=ref, advantages=adv,
                     mask=mask, num_global_tokens=mask.sum().item() if n_tok is None else n_tok,
                     num_global_sequences=n_seq, config=GrpoLossConfig(**cfg))


def test_dual_clip_caps_the_loss_of_negative_advantages():
    # ratios 5, 2, 5 with A = -1, -1, +1; clip [0.8, 1.2]; c = 3
    curr = torch.log(torch.tensor([[5.0, 2.0, 5.0]])).requires_grad_()
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    out = _loss(curr, adv, ratio_clip_c=3.0)
    # max(-A r, -A clamp r): 5, 2, -1.2; dual clip for A<0: min(5, 3) = 3, min(2, 3) = 2
    assert out.loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert out.metrics["dual_clip_fraction"].item() == pytest.approx(1 / 3)
    out.loss.backward()
    assert curr.grad.tolist()[0] == pytest.approx([0.0, 2.0 / 3, 0.0])  # only the unclipped r=2 token moves
    plain = _loss(curr, adv)
    assert plain.loss.item() == pytest.approx((5.0 + 2.0 - 1.2) / 3)
    assert "dual_clip_fraction" not in plain.metrics


def test_token_and_sequence_level_normalisation_differ_in_sign():
    # sequence 0: one token, A = +1 (token loss -1); sequence 1: three tokens, A = -0.5 (token loss +0.5 each)
    curr = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    token = _loss(curr, adv, mask)
    sequence = _loss(curr, adv, mask, n_seq=2, token_level_loss=False)
    assert token.loss.item() == pytest.approx((-1.0 + 3 * 0.5) / 4)  # +0.125
    assert sequence.loss.item() == pytest.approx((-1.0 + 0.5) / 2)  # -0.25
    (grad,) = torch.autograd.grad(sequence.loss, curr)
    # d/dcurr of -A r / n_i / num_sequences at r = 1
    assert grad.flatten().tolist() == pytest.approx([-0.5, 0.0, 0.0, 0.5 / 6, 0.5 / 6, 0.5 / 6])
    with pytest.raises(ValueError):
        _loss(curr, adv, mask, token_level_loss=False)  # needs the global sequence count


def test_gspo_uses_one_ratio_per_sequence_and_sequence_importance_weights():
    prev = torch.zeros(1, 2)
    curr = torch.tensor([[0.2, -0.4]], requires_grad=True)  # mean log-ratio -0.1
    gen = prev - torch.tensor([[LN(2.0), 0.0]])  # sequence weight exp(sum(prev - gen)) = 2
    adv = torch.ones(1, 2)
    out = _loss(curr, adv, prev=prev, gen=gen, n_seq=1, token_level_loss=False, sequence_level_importance_ratios=True)
    ratio = math.exp(-0.1)
    assert out.metrics["ratio_mean"].item() == pytest.approx(ratio)
    assert out.metrics["importance_weight_mean"].item() == pytest.approx(2.0)
    assert out.loss.item() == pytest.approx(-2.0 * ratio)
    out.loss.backward()
    assert curr.grad.tolist()[0] == pytest.approx([-2.0 * ratio / 2, -2.0 * ratio / 2])
    low = _loss(curr.detach() - 1.0, adv, prev=prev, n_seq=1, token_level_loss=False,
                sequence_level_importance_ratios=True, use_importance_sampling_correction=False)
    assert low.loss.item() == pytest.approx(-math.exp(-1.1))  # A > 0, r < 0.8: max(-r, -0.8) = -r (unclipped)
    high = _loss(curr.detach() + 1.0, adv, prev=prev, n_seq=1, token_level_loss=False,
                 sequence_level_importance_ratios=True, use_importance_sampling_correction=False)
    assert high.loss.item() == pytest.approx(-1.2)  # r = exp(0.9) > 1.2: clipped
    assert high.metrics["clip_fraction"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("mode, expected_weights, oob", [
    ("tis", [2.0, 0.25, 1.0, 1.0], None),
    ("icepop", [0.0, 0.0, 1.0, 1.0], 0.5),
    ("seq-mask-tis", [0.0, 0.0, 1.0, 1.0], 0.5),
])
def test_truncated_importance_sampling(mode, expected_weights, oob):
    # weights exp(prev - gen): sequence 0 = [3, 0.25] (geometric mean 0.866), sequence 1 = [1, 1]
    prev = torch.zeros(2, 2)
    gen = -torch.log(torch.tensor([[3.0, 0.25], [1.0, 1.0]]))
    adv = -torch.ones(2, 2)  # token loss = w * ratio(=1) * 1
    cfg = dict(truncated_importance_sampling_ratio=2.0, truncated_importance_sampling_type=mode)
    if mode != "tis":
        cfg["truncated_importance_sampling_ratio_min"] = 0.9 if mode == "seq-mask-tis" else 0.5
    out = _loss(prev.clone(), adv, prev=prev, gen=gen, n_seq=2, **cfg)
    assert out.loss.item() == pytest.approx(sum(expected_weights) / 4)
    assert out.metrics["importance_weight_mean"].item() == pytest.approx(sum(expected_weights) / 4)
    assert (out.metrics["is_oob_ratio"].item() if oob is not None else None) == pytest.approx(oob)


def test_kl_estimators_and_clamps():
    policy, ref = torch.zeros(3), torch.tensor([LN(2.0), -1.0, 30.0])
    k1 = kl_estimate(policy, ref, "k1")
    k2 = kl_estimate(policy, ref, "k2")
    k3 = kl_estimate(policy, ref, "k3", input_clamp=20.0)
    assert k1.tolist() == pytest.approx([-LN(2.0), 1.0, -30.0])
    assert k2.tolist() == pytest.approx([LN(2.0) ** 2 / 2, 0.5, 450.0])
    assert k3.tolist() == pytest.approx([2 - 1 - LN(2.0), math.exp(-1) - 1 + 1, math.exp(20) - 21], rel=1e-5)
    assert kl_estimate(policy, ref, "k3", input_clamp=20.0, output_clamp=10.0)[2].item() == pytest.approx(10.0)
    assert kl_estimate(policy, ref, "k1", output_clamp=0.5).tolist() == pytest.approx([-0.5, 0.5, -0.5])
    with pytest.raises(ValueError):
        kl_estimate(policy, ref, "k4")


def test_loss_kl_term_uses_the_configured_estimator_and_on_policy_weighting():
    curr = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[LN(2.0), 0.0]])
    gen = torch.tensor([[-LN(2.0), 0.0]])  # exp(curr - gen) = 2, 1
    out = _loss(curr, torch.zeros(1, 2), gen=gen, ref=ref, reference_policy_kl_penalty=0.5, reference_policy_kl_type="k2",
                use_importance_sampling_correction=False)
    assert out.metrics["kl"].item() == pytest.approx(LN(2.0) ** 2 / 2 / 2)
    assert out.loss.item() == pytest.approx(0.5 * LN(2.0) ** 2 / 2 / 2)
    weighted = _loss(curr, torch.zeros(1, 2), gen=gen, ref=ref, reference_policy_kl_penalty=0.5,
                     reference_policy_kl_type="k1", use_on_policy_kl_approximation=True,
                     use_importance_sampling_correction=False)
    assert weighted.metrics["kl"].item() == pytest.approx(2.0 * -LN(2.0) / 2)


def test_reinforce_and_forced_on_policy_ratios():
    curr = torch.tensor([[LN(0.5), LN(0.25)]], requires_grad=True)
    prev = torch.tensor([[LN(0.25), LN(0.25)]])
    adv = torch.tensor([[2.0, -1.0]])
    reinforce = _loss(curr, adv, prev=prev, disable_ppo_ratio=True, use_importance_sampling_correction=False)
    assert reinforce.loss.item() == pytest.approx((-2.0 * LN(0.5) + 1.0 * LN(0.25)) / 2)
    (grad,) = torch.autograd.grad(reinforce.loss, curr)
    assert grad.tolist()[0] == pytest.approx([-1.0, 0.5])
    forced = _loss(curr, adv, prev=prev, force_on_policy_ratio=True, use_importance_sampling_correction=False)
    assert forced.loss.item() == pytest.approx((-2.0 + 1.0) / 2)  # ratio 1 although curr != prev
    (grad,) = torch.autograd.grad(forced.loss, curr)
    assert grad.tolist()[0] == pytest.approx([-1.0, 0.5])


CONFIGS = [
    GrpoLossConfig(token_level_loss=False, reference_policy_kl_penalty=0.2, reference_policy_kl_type="k2"),
    GrpoLossConfig(token_level_loss=False, sequence_level_importance_ratios=True, ratio_clip_c=3.0),
    GrpoLossConfig(token_level_loss=False, truncated_importance_sampling_ratio=1.05,
                   truncated_importance_sampling_type="seq-mask-tis", truncated_importance_sampling_ratio_min=0.97),
    GrpoLossConfig(truncated_importance_sampling_ratio=1.1, truncated_importance_sampling_type="icepop",
                   truncated_importance_sampling_ratio_min=0.9, ratio_clip_c=2.0),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_sequence_level_losses_are_split_invariant(config):
    gen = torch.Generator().manual_seed(1)
    batch, width = 8, 6
    curr = (torch.randn(batch, width, generator=gen) * 0.3 - 1).requires_grad_()
    prev = curr.detach() + torch.randn(batch, width, generator=gen) * 0.3
    mask = (torch.rand(batch, width, generator=gen) > 0.3).float()
    mask[3] = 0.0  # a fully masked sequence counts in no normaliser
    inputs = LossInputs(mask=mask, advantages=torch.randn(batch, 1, generator=gen).expand(batch, width),
                        prev_logprobs=prev, generation_logprobs=prev + torch.randn(batch, width, generator=gen) * 0.05,
                        reference_logprobs=prev - 0.2)
    loss_fn = build_loss_fn(config)
    num_tokens, num_sequences = mask.sum().item(), float((mask.sum(-1) > 0).sum())
    whole = loss_fn(curr, inputs, num_tokens, num_sequences)
    (whole_grad,) = torch.autograd.grad(whole.loss, curr)
    total, metrics = 0.0, {}
    for rank in range(2):
        for micro in range(2):
            rows = slice(rank * 4 + micro * 2, rank * 4 + micro * 2 + 2)
            part = LossInputs(*(t[rows] for t in (inputs.mask, inputs.advantages, inputs.prev_logprobs,
                                                  inputs.generation_logprobs, inputs.reference_logprobs)))
            out = loss_fn(curr[rows], part, num_tokens, num_sequences)
            total = total + out.loss
            metrics = {k: metrics.get(k, 0.0) + v.item() for k, v in out.metrics.items()}
    (split_grad,) = torch.autograd.grad(total, curr)
    assert total.item() == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(split_grad, whole_grad, atol=1e-7)
    assert metrics == pytest.approx({k: v.item() for k, v in whole.metrics.items()}, abs=1e-6)


@pytest.mark.parametrize("fields", [
    dict(ratio_clip_c=1.0),
    dict(sequence_level_importance_ratios=True),
    dict(truncated_importance_sampling_ratio=2.0, use_importance_sampling_correction=False),
    dict(truncated_importance_sampling_ratio=2.0, truncated_importance_sampling_type="icepop"),
    dict(reference_policy_kl_type="k5"),
    dict(disable_ppo_ratio=True, force_on_policy_ratio=True),
])
def test_invalid_combinations_are_rejected(fields):
    with pytest.raises(ValueError):
        GrpoLossConfig(**fields)


def test_loss_config_survives_the_proto_round_trip():
    for config in [GrpoLossConfig(), *CONFIGS,
                   GrpoLossConfig(disable_ppo_ratio=True, kl_input_clamp_value=20.0, kl_output_clamp_value=10.0,
                                  use_on_policy_kl_approximation=True, reference_policy_kl_type="k1")]:
        back = loss_from_request(_train_request(config))
        for name, value in vars(config).items():
            assert getattr(back, name) == (pytest.approx(value) if isinstance(value, float) else value), name


def test_masked_positions_never_turn_metrics_into_nan():
    """A masked token (padding, tool observation) whose logprob gap overflows exp() must not
    poison token_mult_prob_error or the loss."""
    import torch

    from trainer_svc.losses.grpo import grpo_loss
    from trainer_svc.types import GrpoLossConfig

    curr = torch.tensor([[-0.5, -1.0, -200.0]], requires_grad=True)
    prev = torch.tensor([[-0.5, -1.0, -200.0]])
    gen = torch.tensor([[-0.5, -1.0, 0.0]])  # |prev - gen| = 200 on the masked token: exp overflows
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = grpo_loss(curr, prev_logprobs=prev, generation_logprobs=gen, reference_logprobs=None,
                    advantages=torch.tensor([[1.0, 1.0, 1.0]]), mask=mask, num_global_tokens=2.0,
                    config=GrpoLossConfig())
    assert torch.isfinite(out.loss)
    assert out.metrics["token_mult_prob_error"].item() == 1.0
    out.loss.backward()
    assert torch.isfinite(curr.grad).all()
