"""The DTensor backend runs the LM head only from the first completion position of a
micro-batch on (HF's logits_to_keep) and computes the entropy metric only at the trained
positions; it frees the gradients once applied. With a real DTensorBackend in a world of one
rank: logprobs (current and reference), a GRPO step's loss, metrics and grad norm, and the
updated weights equal those of the head over every position."""

import pytest
import torch

from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.backends.dtensor.parallel import full_value, local_value
from trainer_svc.config import TrainerSettings
from trainer_svc.losses import masked_entropy_sum
from trainer_svc.types import GrpoLossConfig, Sample


def _samples(n: int = 8) -> list[Sample]:
    """Prompts of 3 to 7 tokens and completions of 2 to 5: the rows' windows differ."""
    generator = torch.Generator().manual_seed(5)
    samples = []
    for i in range(n):
        prompt = [1, *torch.randint(4, 40, (2 + i % 5,), generator=generator).tolist()]
        completion = torch.randint(4, 40, (2 + i % 4,), generator=generator).tolist()
        gen = (-3.0 - torch.rand(len(completion), generator=generator) * 0.2).tolist()
        samples.append(Sample([*prompt, *completion], len(prompt), generation_logprobs=gen,
                              advantage=(-1.0) ** i * (0.5 + 0.1 * i)))
    return samples


def _run(env, completion_only: bool) -> dict:
    backend = DTensorBackend(TrainerSettings(model_name=str(ensure_tiny_model(cache_root())), seed=0), env)
    backend.completion_logits_only = completion_only
    widths = []
    head = backend._model.get_output_embeddings()
    hook = head.register_forward_hook(lambda module, args, out: widths.append(out.shape[1]))
    samples = _samples()
    with torch.no_grad():  # move the weights off the reference so the two policies differ
        for p in backend._params:
            local_value(p).add_(torch.randn(local_value(p).shape, generator=torch.Generator().manual_seed(1)) * 0.01)
    current = backend.compute_logprobs(samples, "current", 4)
    reference = backend.compute_logprobs(samples, "reference", 4)
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.05, ratio_clip_min=0.1, ratio_clip_max=0.1)
    metrics = backend.train_step(samples, loss, 8, 4, None).metrics
    hook.remove()
    grads_freed = all(p.grad is None for p in backend._params)
    weights = [full_value(p).clone() for p in backend._params]
    backend.close()
    return {"current": current, "reference": reference, "metrics": metrics, "weights": weights, "widths": widths,
            "grads_freed": grads_freed}


def test_completion_logits_equal_the_full_head(world_of_one):
    fast, full = _run(world_of_one, True), _run(world_of_one, False)
    samples = _samples()
    longest = [max(len(s.token_ids) for s in samples[i:i + 4]) for i in (0, 4)]
    shortest_prompt = [min(s.prompt_length for s in samples[i:i + 4]) for i in (0, 4)]
    # 2 logprob calls + the reference pass + the training forward, 2 micro-batches each
    assert full["widths"] == longest * 4
    assert fast["widths"] == [n - p + 1 for n, p in zip(longest, shortest_prompt)] * 4
    for key in ("current", "reference"):
        for a, b in zip(fast[key], full[key]):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6), key
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "clip_fraction", "ratio_mean",
                "token_mult_prob_error"):
        assert fast["metrics"][key] == pytest.approx(full["metrics"][key], rel=1e-5, abs=1e-7), key
    assert fast["metrics"]["kl"] > 0 and fast["metrics"]["entropy"] > 0
    for a, b in zip(fast["weights"], full["weights"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert fast["grads_freed"] and full["grads_freed"]


def test_entropy_at_the_masked_positions_only():
    logits = torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(0)) * 3
    mask = (torch.rand(3, 7, generator=torch.Generator().manual_seed(1)) > 0.4).float()
    logits[mask == 0] = float("nan")  # never read
    logp = torch.log_softmax(logits.nan_to_num(0.0), dim=-1)
    expected = ((-(logp.exp() * logp).sum(-1)) * mask).sum()
    for chunk in (1, 4, 256):
        torch.testing.assert_close(masked_entropy_sum(logits, mask, chunk_positions=chunk), expected)
    assert masked_entropy_sum(logits, torch.zeros(3, 7)) == 0.0
