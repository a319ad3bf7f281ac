"""GPU check of LoRA adapter-only sync's trainer and generator pieces that need no vLLM: the
adapters and the merged weights exported from CUDA tensors (a 4-layer Qwen2 of Qwen2.5-0.5B's
width, q/k/v biases included), the adapters written as the generator writes them, loaded by PEFT on
the GPU and compared with the trainer's merged model (weights and logits). Runs on a bare CUDA
image with torch, transformers and peft (pydantic added): the DTensor package's __init__, which
builds the whole backend, is bypassed.

    PYTHONPATH=. python3 benchmarks/gpu_lora_adapters.py OUT.json
"""
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

pkg = types.ModuleType("trainer_svc.backends.dtensor")  # its __init__ builds the whole backend
pkg.__path__ = ["trainer_svc/backends/dtensor"]
sys.modules["trainer_svc.backends.dtensor"] = pkg
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM

from generator_svc.lora_adapter import write_adapter
from trainer_svc.backends.dtensor import lora
from trainer_svc.config.lora import LoraSettings
from trainer_svc.held_bytes import HeldBytes

out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
work = Path(tempfile.mkdtemp())
config = AutoConfig.for_model("qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                              num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config).save_pretrained(work / "base")
cfg = LoraSettings(enabled=True, dim=8, alpha=16)
model = lora.wrap(AutoModelForCausalLM.from_pretrained(work / "base", dtype=torch.float32).cuda(), cfg)
lora.init_adapters(model, cfg, 0)
with torch.no_grad():
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.normal_(0, 0.02)
names = list(AutoModelForCausalLM.from_pretrained(work / "base").state_dict())
names = [n for n in names if n != "lm_head.weight"]
torch.cuda.synchronize(); t = time.perf_counter()
adapters = dict(lora.iter_adapters(model, 0, HeldBytes()))
torch.cuda.synchronize(); out["adapters_s"] = round(time.perf_counter() - t, 4)
out["adapter_bytes"] = sum(a.numel() * a.element_size() for a in adapters.values())
out["adapters_on"] = sorted({str(a.device) for a in adapters.values()})
t = time.perf_counter()
merged = dict(lora.iter_merged(model, names, cfg.scaling, 0, HeldBytes()))
torch.cuda.synchronize(); out["merged_s"] = round(time.perf_counter() - t, 4)
out["merged_bytes"] = sum(m.numel() * m.element_size() for m in merged.values())
out["has_q_bias"] = "model.layers.0.self_attn.q_proj.bias" in merged
(work / "adapter").mkdir()
t = time.perf_counter()
write_adapter(adapters, work / "adapter", cfg.dim, cfg.alpha, str(work / "base"))
out["write_s"] = round(time.perf_counter() - t, 4)
peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(work / "base", dtype=torch.float32).cuda(),
                                 str(work / "adapter")).merge_and_unload()
served = peft.state_dict()
out["max_abs_diff_merged_vs_peft"] = max(float((served[n] - merged[n]).abs().max()) for n in merged)
ids = torch.randint(0, 151936, (4, 32), device="cuda")
with torch.no_grad():
    a = model(ids).logits.float(); b = peft(ids).logits.float()
out["max_abs_logit_diff"] = float((a - b).abs().max())
out["ok"] = out["max_abs_diff_merged_vs_peft"] < 1e-5 and out["max_abs_logit_diff"] < 1e-3 and out["has_q_bias"]
print(json.dumps(out))
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
