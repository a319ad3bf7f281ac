"""A LoRA adapter received as a weight version (the trainer's `lora_cfg.weight_sync: adapter`),
written where vLLM's LoRA manager reads adapters: a directory in PEFT's layout.

The tensors arrive under the names PEFT saves (`...q_proj.lora_A.weight`); the adapter's
config is the run's rank and alpha (GeneratorSettings.lora_adapters) and the modules the tensors
name. Runs in vLLM's worker (worker_extension.WRITE_ADAPTER); the engine then loads the
directory (generator_svc/engines/served_weights.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def target_modules(names: list[str]) -> list[str]:
    """The module names the adapter's tensors adapt (`...self_attn.q_proj.lora_A.weight` -> q_proj), sorted."""
    modules = set()
    for name in names:
        stem, sep, _ = name.rpartition(".lora_")
        if not sep:
            raise ValueError(f"{name!r} is not a LoRA adapter tensor (PEFT's names: <module>.lora_A.weight, "
                             "<module>.lora_B.weight): the trainer publishes merged weights, or the generator was "
                             "started for adapters by mistake")
        modules.add(stem.rpartition(".")[2])
    return sorted(modules)


def adapter_config(names: list[str], rank: int, alpha: float, base_model: str) -> dict:
    """PEFT's adapter_config.json for tensors `names` (plain LoRA: no bias, no DoRA, no rsLoRA)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "target_modules": target_modules(names), "bias": "none", "lora_dropout": 0.0,
            "use_rslora": False, "use_dora": False, "base_model_name_or_path": base_model}


def write_adapter(tensors: Mapping[str, torch.Tensor], directory: Path, rank: int, alpha: float,
                  base_model: str) -> int:
    """Write `tensors` as a PEFT adapter into `directory` (which exists); returns the tensors written."""
    from safetensors.torch import save_file

    names = list(tensors)
    config = adapter_config(names, rank, alpha, base_model)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in tensors.items()}, str(directory / ADAPTER_FILE),
              metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    return len(names)
