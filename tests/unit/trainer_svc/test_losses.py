"""The trainer's loss functions against hand-computed values, and their split invariance."""

import math

import pytest
import torch

from trainer_svc.losses import LossInputs, build_loss_fn, grpo_loss, nll_loss
from trainer_svc.types import GrpoLossConfig, NllLossConfig


def _grpo(curr, prev, gen, adv, mask, n, ref=None, **cfg):
    return grpo_loss(curr, prev_logprobs=prev, generation_logprobs=gen, reference_logprobs=ref, advantages=adv,
                     mask=mask, num_global_tokens=n, config=GrpoLossConfig(**cfg))


def test_grpo_clips_on_both_sides_for_both_advantage_signs():
    # ratios 1.5, 0.5, 1.5, 0.5 with advantages +1, +1, -1, -1; clip range [0.9, 1.3]
    prev = torch.zeros(1, 4)
    curr = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    out = _grpo(curr, prev, prev, adv, torch.ones(1, 4), 4, ratio_clip_min=0.1, ratio_clip_max=0.3)
    # max(-A r, -A clamp(r)): -1.3 (clipped above), -0.5, 1.5, 0.9 (clipped below)
    assert out.loss.item() == pytest.approx((-1.3 - 0.5 + 1.5 + 0.9) / 4)
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.5)
    assert out.metrics["ratio_mean"].item() == pytest.approx(1.0)
    out.loss.backward()
    # d(-A r)/d curr = -A r on the unclipped tokens; clipped tokens get no gradient
    assert curr.grad.tolist()[0] == pytest.approx([0.0, -0.5 / 4, 1.5 / 4, 0.0])


def test_grpo_importance_weights_and_prob_error():
    prev = torch.tensor([[0.0, -1.0]])
    gen = prev - torch.tensor([[math.log(2.0), 0.0]])  # w = exp(prev - gen) = 2, 1
    curr = prev.clone().requires_grad_()
    adv = torch.tensor([[1.0, -3.0]])
    out = _grpo(curr, prev, gen, adv, torch.ones(1, 2), 2)
    assert out.loss.item() == pytest.approx((-1.0 * 2 + 3.0 * 1) / 2)
    assert out.metrics["importance_weight_mean"].item() == pytest.approx(1.5)
    assert out.metrics["token_mult_prob_error"].item() == pytest.approx((2.0 + 1.0) / 2)
    out.loss.backward()
    assert curr.grad.tolist()[0] == pytest.approx([-2.0 / 2, 3.0 / 2])
    uncorrected = _grpo(curr, prev, gen, adv, torch.ones(1, 2), 2, use_importance_sampling_correction=False)
    assert uncorrected.loss.item() == pytest.approx((-1.0 + 3.0) / 2)
    assert uncorrected.metrics["token_mult_prob_error"].item() == pytest.approx(1.5)


def test_grpo_k3_kl_term():
    prev = torch.zeros(1, 2)
    curr = prev.clone().requires_grad_()
    ref = torch.tensor([[math.log(2.0), 0.0]])  # k3 = 2 - ln 2 - 1, 0
    out = _grpo(curr, prev, prev, torch.zeros(1, 2), torch.ones(1, 2), 2, ref=ref, reference_policy_kl_penalty=0.5)
    k3 = 2.0 - math.log(2.0) - 1.0
    assert out.metrics["kl"].item() == pytest.approx(k3 / 2)
    assert out.metrics["pg_loss"].item() == pytest.approx(0.0)
    assert out.loss.item() == pytest.approx(0.5 * k3 / 2)
    out.loss.backward()
    # d k3 / d curr = 1 - exp(ref - curr)
    assert curr.grad.tolist()[0] == pytest.approx([0.5 * (1 - 2.0) / 2, 0.0])
    with pytest.raises(ValueError):
        _grpo(curr, prev, prev, torch.zeros(1, 2), torch.ones(1, 2), 2, reference_policy_kl_penalty=0.5)


def test_masked_tokens_do_not_count():
    prev = torch.zeros(2, 3)
    curr = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 7.0]]).requires_grad_()
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    out = _grpo(curr, prev, prev, torch.ones(2, 3), mask, 4)
    assert out.loss.item() == pytest.approx(-1.0)  # four unmasked tokens at ratio 1, A = 1
    assert out.metrics["clip_fraction"].item() == 0.0
    out.loss.backward()
    assert (curr.grad * (1 - mask)).abs().sum().item() == 0.0
    nll = nll_loss(torch.log(torch.tensor([[0.5, 1e-9, 0.25]])), mask=torch.tensor([[1.0, 0.0, 1.0]]),
                   num_global_tokens=2)
    assert nll.loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    empty = nll_loss(torch.zeros(1, 2, requires_grad=True), mask=torch.zeros(1, 2), num_global_tokens=0)
    assert empty.loss.item() == 0.0


@pytest.mark.parametrize("config", [GrpoLossConfig(ratio_clip_min=0.1, reference_policy_kl_penalty=0.3),
                                    NllLossConfig()])
def test_splitting_into_micro_batches_and_ranks_gives_the_same_loss_and_gradient(config):
    gen = torch.Generator().manual_seed(0)
    batch, width = 8, 6
    curr = (torch.randn(batch, width, generator=gen) * 0.3 - 1).requires_grad_()
    prev = curr.detach() + torch.randn(batch, width, generator=gen) * 0.3
    inputs = LossInputs(mask=(torch.rand(batch, width, generator=gen) > 0.3).float(),
                        advantages=torch.randn(batch, 1, generator=gen).expand(batch, width),
                        prev_logprobs=prev, generation_logprobs=prev + torch.randn(batch, width, generator=gen) * 0.1,
                        reference_logprobs=prev - 0.2)
    loss_fn = build_loss_fn(config)
    num_tokens = inputs.mask.sum().item()

    whole = loss_fn(curr, inputs, num_tokens)
    (whole_grad,) = torch.autograd.grad(whole.loss, curr)

    # 2 simulated ranks x 2 micro-batches of 2 samples, every piece normalised by the global count
    total, metrics = 0.0, {}
    for rank in range(2):
        for micro in range(2):
            rows = slice(rank * 4 + micro * 2, rank * 4 + micro * 2 + 2)
            part = LossInputs(*(None if t is None else t[rows] for t in
                                (inputs.mask, inputs.advantages, inputs.prev_logprobs, inputs.generation_logprobs,
                                 inputs.reference_logprobs)))
            out = loss_fn(curr[rows], part, num_tokens)
            total = total + out.loss
            metrics = {k: metrics.get(k, 0.0) + v.item() for k, v in out.metrics.items()}
    (split_grad,) = torch.autograd.grad(total, curr)
    assert total.item() == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(split_grad, whole_grad, atol=1e-7)
    assert metrics == pytest.approx({k: v.item() for k, v in whole.metrics.items()}, abs=1e-6)


def test_build_loss_fn_declares_what_it_needs():
    grpo = build_loss_fn(GrpoLossConfig())
    assert grpo.needs_previous_logprobs and grpo.needs_generation_logprobs and not grpo.needs_reference_logprobs
    assert build_loss_fn(GrpoLossConfig(reference_policy_kl_penalty=0.01)).needs_reference_logprobs
    nll = build_loss_fn(NllLossConfig())
    assert not (nll.needs_previous_logprobs or nll.needs_reference_logprobs or nll.needs_generation_logprobs)
