"""LoRA on the DTensor backend, on real torchrun ranks (2 ranks, FSDP over both, gloo, CPU):
with adapter dropout 0.1 only the adapters require gradients and are in the optimizer, the
on-policy shortcut is off (dropout makes training forwards differ from scoring ones), three
GRPO steps move exactly the adapted linear layers of the merged model (embeddings, norms and
the head stay the base's), the merged export equals PEFT's own merge of the exported adapter
over the base checkpoint, the trainer's logprobs are the merged model's, and a checkpoint holds
the adapters alone."""

from __future__ import annotations

import pytest
import torch

from coordinator.embedded.tiny_model import ensure_tiny_model
from tests.integration.test_megatron_backend import run_worker
from tests.megatron.worker import fixed_samples

pytestmark = pytest.mark.integration


def test_lora_trains_only_adapters_and_exports_the_merged_model(tmp_path):
    model_dir = str(ensure_tiny_model(tmp_path / "models"))
    settings = {"model_name": model_dir, "optimizer": {"lr": 1e-2},
                "dtensor_cfg": {"lora_cfg": {"enabled": True, "dim": 4, "alpha": 8, "dropout": 0.1,
                                             "dropout_position": "pre"}}}
    out, _ = run_worker(tmp_path, settings, "lora", 2, tmp_path / "cache")
    assert out["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in out["trainable"])
    assert out["optimized"] == len(out["trainable"]) == 4 * 7 * 2  # 4 layers x 7 linears x (A, B)
    assert out["dropout_free"] is False
    assert all(s["grad_norm"] > 0 for s in out["steps"])
    adapted = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert len(out["moved"]) == 28 and all(n.split(".")[-2] in adapted for n in out["moved"])
    assert out["names_equal"] and out["merged_vs_peft"] < 1e-6
    assert out["checkpoint_model_keys"] and all(".lora_" in k for k in out["checkpoint_model_keys"])

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                       out["merged_dir"]).merge_and_unload().eval()
    samples = fixed_samples(merged.config.vocab_size)
    for sample, trainer in zip(samples, out["logprobs"]):
        with torch.no_grad():
            logits = merged(torch.tensor([sample.token_ids])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(sample.token_ids[1:]).unsqueeze(-1))
        expected = lp.squeeze(-1)[sample.prompt_length - 1:].tolist()
        assert max(abs(a - b) for a, b in zip(trainer, expected)) < 1e-4
