"""The reference policy's copy of the initial weights: half size when they fit bfloat16 exactly
(a bfloat16 checkpoint upcast by the trainer), and a reference pass that holds exactly the
reference's float32 values and gives the live ones back bit for bit, as the full-size copy does."""

import pytest
import torch

from trainer_svc.backends.dtensor.parallel import full_value, local_value
from trainer_svc.backends.reference import ReferenceWeights, expand_copy


def _params(bf16_exact: bool) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(shape, generator=generator) for shape in ((5, 7), (3,), (2, 3, 4))]
    if bf16_exact:
        values = [v.bfloat16().float() for v in values]
    return [torch.nn.Parameter(v) for v in values]


def _train(params: list[torch.nn.Parameter]) -> None:
    """Move the live weights off bfloat16's grid (low halves non-zero)."""
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 1e-3)


@pytest.mark.parametrize("compact", [True, False])
def test_a_reference_pass_holds_the_reference_and_gives_the_live_weights_back(compact):
    params = _params(bf16_exact=True)
    initial = [p.detach().clone() for p in params]
    reference = ReferenceWeights(params, compact=compact)
    assert reference.num_bytes == sum(p.numel() for p in params) * (2 if compact else 4)
    for _ in range(2):  # the copies are the reference's again after a pass
        _train(params)
        live = [p.detach().clone() for p in params]
        with reference.holding("reference"):
            for p, want in zip(params, initial):
                assert torch.equal(p, want)
        for p, want in zip(params, live):
            assert torch.equal(p, want)
    with reference.holding("current"):
        for p, want in zip(params, live):
            assert torch.equal(p, want)
    for copy, p, want in zip(reference._copies, params, initial):
        assert torch.equal(expand_copy(copy, p), want)


def test_weights_off_the_bfloat16_grid_keep_a_full_copy():
    params = _params(bf16_exact=False)
    params[1] = torch.nn.Parameter(params[1].detach().bfloat16().float())  # this one fits
    reference = ReferenceWeights(params)
    assert [c.dtype for c in reference._copies] == [torch.float32, torch.bfloat16, torch.float32]
    initial = [p.detach().clone() for p in params]
    _train(params)
    with reference.holding("reference"):
        for p, want in zip(params, initial):
            assert torch.equal(p, want)



@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    """The embedded tiny model saved in bfloat16 (as real checkpoints ship)."""
    import shutil

    from transformers import AutoModelForCausalLM

    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model

    source = ensure_tiny_model(cache_root())
    out = tmp_path_factory.mktemp("bf16")
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    return out


def test_a_backend_trains_the_same_with_the_half_size_reference(world_of_one, bf16_checkpoint):
    from trainer_svc.backends.dtensor.backend import DTensorBackend
    from trainer_svc.config import TrainerSettings
    from trainer_svc.types import GrpoLossConfig, Sample

    samples = [Sample([1, 10 + i, 12, 5, 20 + i, 30, 7 + i], 4, generation_logprobs=[-3.0, -3.1, -2.9],
                      advantage=(-1.0) ** i) for i in range(8)]
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.1)
    runs = []
    for compact in (True, False):
        backend = DTensorBackend(TrainerSettings(model_name=str(bf16_checkpoint)), world_of_one)
        backend._reference = ReferenceWeights(backend._params, local_value, compact=compact)
        assert {c.dtype for c in backend._reference._copies} == {torch.bfloat16 if compact else torch.float32}
        metrics = [backend.train_step(samples, loss, 8, 4, None).metrics for _ in range(2)]
        runs.append((metrics, backend.compute_logprobs(samples, "reference", 4),
                     [full_value(p).clone() for p in backend._params]))
        backend.close()
    (compact_metrics, compact_ref, compact_weights), (full_metrics, full_ref, full_weights) = runs
    assert compact_metrics == full_metrics and compact_ref == full_ref  # bit for bit
    assert compact_metrics[1]["kl"] > 0
    for a, b in zip(compact_weights, full_weights):
        assert torch.equal(a, b)
