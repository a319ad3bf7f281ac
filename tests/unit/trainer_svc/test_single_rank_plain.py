"""A one-rank float32 trainer runs its model without FSDP2 (trainer_svc/backends/dtensor/model.py
`needs_fsdp`): FSDP2 would shard nothing there, only copy every layer's parameters before each
forward and backward. It must train exactly as the FSDP2-wrapped model does: the same losses,
gradient norms, reference logprobs and weights, bit for bit, over steps with a KL reference;
and a tied embedding and LM head must stay one parameter (trained once, saved once)."""

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy
from transformers import AutoConfig, AutoModelForCausalLM

import trainer_svc.backends.dtensor.model as model_module
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.backends.dtensor.model import needs_fsdp
from trainer_svc.backends.dtensor.parallel import full_value
from trainer_svc.config import TrainerSettings
from trainer_svc.types import GrpoLossConfig, Sample


def test_fsdp_only_where_it_does_something():
    assert not needs_fsdp(1, torch.float32, OffloadPolicy())
    assert needs_fsdp(2, torch.float32, OffloadPolicy())  # shards across ranks
    assert needs_fsdp(1, torch.bfloat16, OffloadPolicy())  # its mixed precision: float32 kept, bf16 computed
    assert needs_fsdp(1, torch.float32, CPUOffloadPolicy())


@pytest.fixture(scope="module")
def tied_checkpoint(tmp_path_factory):
    """A tiny Qwen2 with its LM head tied to the embedding, as Qwen2.5-0.5B ships."""
    out = tmp_path_factory.mktemp("tied")
    config = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


@pytest.mark.parametrize("model", ["embedded", "tied"])
def test_the_plain_one_rank_model_trains_as_the_fsdp_wrapped_one(world_of_one, monkeypatch, tmp_path, model,
                                                                  tied_checkpoint):
    path = tied_checkpoint if model == "tied" else ensure_tiny_model(cache_root())
    samples = [Sample([1, 10 + i, 12, 5, 20 + i, 30, 7 + i], 4, generation_logprobs=[-3.0, -3.1, -2.9],
                      advantage=(-1.0) ** i * (1 + 0.1 * i)) for i in range(8)]
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.05)
    runs, sizes = {}, {}
    for wrapped in (False, True):
        monkeypatch.setattr(model_module, "needs_fsdp", lambda *args, wrapped=wrapped: wrapped)
        backend = DTensorBackend(TrainerSettings(model_name=str(path), seed=0), world_of_one)
        assert any(isinstance(m, FSDPModule) for m in backend._model.modules()) == wrapped
        hf = backend._model
        tied = hf.lm_head.weight is hf.get_input_embeddings().weight
        assert tied == (model == "tied")  # the plain model's materialization and load must not untie them
        metrics = [backend.train_step(samples, loss, 8, 4, 1e-3).metrics for _ in range(3)]
        runs[wrapped] = (metrics, backend.compute_logprobs(samples, "reference", 4),
                         [full_value(p).clone() for p in backend._params])
        backend.save_checkpoint(tmp_path / str(wrapped))
        sizes[wrapped] = sum(f.stat().st_size for f in (tmp_path / str(wrapped)).rglob("*.distcp"))
        backend.close()
    (plain_metrics, plain_ref, plain_weights), (fsdp_metrics, fsdp_ref, fsdp_weights) = runs[False], runs[True]
    assert plain_metrics == fsdp_metrics and plain_ref == fsdp_ref
    assert sizes[False] == sizes[True]  # a tied weight and its Adam moments written once
    assert plain_metrics[-1]["loss"] != plain_metrics[0]["loss"] and plain_metrics[-1]["kl"] > 0
    for a, b in zip(plain_weights, fsdp_weights):
        assert torch.equal(a, b)
