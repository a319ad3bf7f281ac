"""Sequence-level normalisation and GSPO ratios through the real trainer (2 torchrun ranks,
micro-batches of one): loss, KL and grad norm equal one unsharded computation in this process,
with a fully masked sample that must count in no normaliser."""

import dataclasses
import math

import pytest
import torch

from tests.integration.test_trainer_service import _hf_logprobs, _hf_model, _samples, trainer  # noqa: F401
from trainer_svc.losses import grpo_loss
from trainer_svc.types import GrpoLossConfig

pytestmark = pytest.mark.integration


def test_sequence_level_gspo_step_matches_one_process_computation(trainer, tmp_path):  # noqa: F811
    config = GrpoLossConfig(token_level_loss=False, sequence_level_importance_ratios=True, ratio_clip_c=3.0,
                            reference_policy_kl_penalty=0.1, reference_policy_kl_type="k2",
                            kl_input_clamp_value=20.0, kl_output_clamp_value=10.0)
    samples = _samples(7)[:4]
    trainer.client.export_hf(str(tmp_path / "now"))
    model, reference = _hf_model(tmp_path / "now"), _hf_model(trainer.model_dir)
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():
        prev = [_hf_logprobs(model, s) for s in samples]
        ref = [_hf_logprobs(reference, s) for s in samples]
    gen = [p + 0.05 * torch.randn(p.shape, generator=noise) for p in prev]
    masks = [None, None, [0.0] * samples[2].completion_length, None]  # sample 2: filtered out
    batch = [dataclasses.replace(s, generation_logprobs=g.tolist(), advantage=a, loss_mask=m)
             for s, g, a, m in zip(samples, gen, (1.0, -0.5, 0.7, -1.0), masks)]

    num_tokens = sum(s.completion_length for s, m in zip(batch, masks) if m is None)
    total, kl = 0.0, 0.0
    for s, p, r, g in zip(batch, prev, ref, gen):  # each sample alone, normalised by the whole batch's counts
        curr = _hf_logprobs(model, s)[None]
        mask = torch.tensor([s.loss_mask or [1.0] * s.completion_length])
        out = grpo_loss(curr, prev_logprobs=p[None], generation_logprobs=g[None], reference_logprobs=r[None],
                        advantages=torch.full_like(curr, s.advantage), mask=mask, num_global_tokens=num_tokens,
                        num_global_sequences=3, config=config)
        total, kl = total + out.loss, kl + out.metrics["kl"].item()
    total.backward()
    grad_norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))

    result = trainer.client.train_step(batch, config, global_batch_size=4, micro_batch_size=1)
    assert result.metrics["loss"] == pytest.approx(total.item(), rel=1e-4, abs=1e-6)
    assert result.metrics["kl"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
    assert result.metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert result.metrics["num_tokens"] == num_tokens
