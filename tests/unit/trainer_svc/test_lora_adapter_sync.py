"""LoRA adapter-only weight sync (lora_cfg.weight_sync: adapter), the parts that run without
vLLM: the trainer publishes the adapters alone under PEFT's saved names, the bucket plan holds
only them, and what a generator writes from the received tensors (generator_svc/lora_adapter.py)
is an adapter that PEFT loads over the base checkpoint to the trainer's merged model. The config
refuses the combinations it cannot serve. The served path through vLLM runs in
tests/integration/test_recipes.py (CPU) and test_lora_adapter_sync_gpu.py (GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from coordinator.config import load_config
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import generator_settings, trainer_settings
from generator_svc.config import GeneratorSettings, LoraAdapterServing
from generator_svc.lora_adapter import target_modules, write_adapter
from tests.buckets import unpack
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.publish import weight_sync_plan
from trainer_svc.types import GrpoLossConfig, Sample

ADAPTER = ["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.weight_sync=adapter"]


def _samples() -> list[Sample]:
    generator = torch.Generator().manual_seed(3)
    return [Sample([1, 10 + i, 12, *torch.randint(4, 40, (4,), generator=generator).tolist()], 3,  # ids < 64
                   generation_logprobs=[-3.0] * 4, advantage=(-1.0) ** i) for i in range(4)]


def test_the_published_adapters_load_in_peft_as_the_trainers_merged_model(world_of_one, tmp_path):
    model_dir = ensure_tiny_model(cache_root())
    cfg = load_config(overrides=[*ADAPTER, "policy.optimizer.kwargs.lr=0.05", "cluster.trainer_ranks=1"])
    backend = DTensorBackend(trainer_settings(cfg, str(model_dir)), world_of_one)
    backend.train_step(_samples(), GrpoLossConfig(), 4, 4, None)  # B moves off zero
    assert list(backend.published_tensor_shapes) and all(".lora_" in n for n in backend.published_tensor_shapes)
    assert not any(".default." in n for n in backend.published_tensor_shapes)
    plan = weight_sync_plan(trainer_settings(cfg, str(model_dir)), backend)
    full_bytes = sum(torch.Size(s).numel() * 4 for s in backend.hf_tensor_shapes.values())
    assert [t.name for t in plan.tensors] == list(backend.published_tensor_shapes)
    assert plan.total_bytes < full_bytes / 5

    received = unpack(plan, backend.iter_published_tensors())  # what a receiver reads
    assert any(n.endswith("lora_B.weight") and t.abs().max() > 0 for n, t in received.items())
    lora = cfg.policy.dtensor_cfg.lora_cfg
    assert write_adapter(received, tmp_path, lora.dim, lora.alpha, str(model_dir)) == len(received)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == lora.dim and config["lora_alpha"] == lora.alpha
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]

    from peft import PeftModel

    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                       str(tmp_path)).merge_and_unload().state_dict()
    merged = dict(backend.iter_hf_tensors())
    moved = [n for n in merged if not torch.equal(merged[n], AutoModelForCausalLM.from_pretrained(model_dir).state_dict()[n])]
    assert moved  # the adapters changed the model
    for name, tensor in merged.items():
        assert torch.allclose(served[name], tensor, atol=1e-6), name


def test_merged_weights_of_a_model_with_biased_adapted_layers_hold_its_biases(world_of_one, tmp_path):
    """Qwen2's q/k/v projections have biases, which PEFT keeps under the adapted layer's
    base_layer: the merged export (and so every merged publish) read them under the HF name and
    failed with a KeyError at the first publish of a Qwen2.5-shaped checkpoint (found by
    benchmarks/lora_publish.py --model at the 0.5B shape; this test fails so without the fix)."""
    config = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "qwen2")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "qwen2").state_dict()
    assert "model.layers.0.self_attn.q_proj.bias" in base
    cfg = load_config(overrides=["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.optimizer.kwargs.lr=0.05",
                                 "cluster.trainer_ranks=1"])
    backend = DTensorBackend(trainer_settings(cfg, str(tmp_path / "qwen2")), world_of_one)
    backend.train_step(_samples(), GrpoLossConfig(), 4, 4, None)
    merged = dict(backend.iter_hf_tensors())
    assert merged.keys() == backend.hf_tensor_shapes.keys()
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.bias"], base["model.layers.0.self_attn.q_proj.bias"])
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])


def test_tensors_that_are_not_adapters_are_refused_by_name():
    assert target_modules(["m.layers.0.mlp.up_proj.lora_A.weight", "m.layers.0.mlp.up_proj.lora_B.weight"]) == ["up_proj"]
    with pytest.raises(ValueError, match="not a LoRA adapter tensor"):
        target_modules(["model.layers.0.mlp.up_proj.weight"])


def test_vllm_gets_the_smallest_max_lora_rank_that_holds_the_adapters():
    assert [LoraAdapterServing(rank=r, alpha=1).max_lora_rank for r in (1, 4, 8, 9, 300)] == [1, 8, 8, 16, 320]


def test_adapter_sync_config_reaches_the_generators_and_keeps_their_weights():
    cfg = load_config(overrides=ADAPTER)
    assert cfg.generators_serve_adapters and not cfg.generators_free_weights
    settings = generator_settings(cfg, "model", 0, Path("scratch"))
    assert settings.lora_adapters == LoraAdapterServing(rank=8, alpha=32)
    assert generator_settings(load_config(), "model", 0, Path("scratch")).lora_adapters is None


@pytest.mark.parametrize(("overrides", "message"), [
    (["policy.dtensor_cfg.lora_cfg.weight_sync=adapter"], "only exist with lora_cfg.enabled"),
    ([*ADAPTER, "policy.generation.colocated.enabled=true"], "colocated.enabled: false"),
    ([*ADAPTER, "policy.generation.free_weights_while_training=true"], "free_weights_while_training: false"),
    ([*ADAPTER, "grpo.async_grpo.enabled=true", "grpo.async_grpo.in_flight_weight_updates=true",
      "loss_fn.use_importance_sampling_correction=true"], "in_flight_weight_updates: false"),
])
def test_adapter_sync_refuses_what_it_cannot_serve(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(overrides=overrides)


def test_a_generator_serving_adapters_keeps_its_base_weights():
    with pytest.raises(ValueError, match="lora_adapters serves adapters over base weights"):
        GeneratorSettings(model_name="m", lora_adapters=LoraAdapterServing(rank=8, alpha=16),
                          free_weights_while_training=True)
