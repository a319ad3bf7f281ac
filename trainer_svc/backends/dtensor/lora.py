"""LoRA adapters on the DTensor backend (`policy.dtensor_cfg.lora_cfg`), through PEFT.

- The policy is wrapped with PEFT's LoRA layers before it is sharded (FSDP2 shards base weights
  and adapters alike); PEFT freezes the base weights, so the optimizer, the gradient clip and the
  reference policy (the initial adapters: B = 0, i.e. the base model) hold adapters only.
- A starts as `lora_A_init` says (xavier normal, or kaiming uniform as PEFT does), drawn on rank 0
  from the run's seed and broadcast with the base weights; B starts at zero.
- What leaves the trainer is the merged model under the base model's HF names, one tensor at a
  time: W + alpha/dim * B A for an adapted linear layer (`iter_merged`), so generators, the
  shared-memory publish and exports need nothing LoRA-specific. `export_adapter` also writes the
  adapters alone in PEFT's layout (adapter_config.json + adapter_model.safetensors), which
  `PeftModel.from_pretrained(base, dir)` loads.
- With `weight_sync: adapter` a publish carries the adapters alone instead (`adapter_shapes`,
  `iter_adapters`: the names and layout `export_adapter` writes), and generators serve them over
  their base weights (generator_svc/engines/served_weights.py).
- Checkpoints hold the adapters and their optimizer state only (the base never changes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from trainer_svc.backends.dtensor.parallel import full_value
from trainer_svc.config.lora import LoraSettings
from trainer_svc.held_bytes import HeldBytes

PREFIX = "base_model.model."
ADAPTER = "default"


def peft_config(cfg: LoraSettings, model_name: str | None = None):
    from peft import LoraConfig

    return LoraConfig(r=cfg.dim, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                      target_modules="all-linear" if cfg.match_all_linear else list(cfg.target_modules),
                      exclude_modules=list(cfg.exclude_modules) or None, base_model_name_or_path=model_name)


def wrap(model: nn.Module, cfg: LoraSettings) -> nn.Module:
    """`model` with LoRA layers (PEFT's PeftModel; base weights frozen)."""
    from peft import get_peft_model

    wrapped = get_peft_model(model, peft_config(cfg))
    if not any(n.endswith(f"lora_A.{ADAPTER}.weight") for n, _ in wrapped.named_parameters()):
        raise ValueError(f"lora_cfg.target_modules {list(cfg.target_modules)} match no linear layer of the model")
    return wrapped


@torch.no_grad()
def init_adapters(model: nn.Module, cfg: LoraSettings, seed: int) -> None:
    """A from `lora_A_init`, B zero (on rank 0's full model, before the broadcast)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith(f"lora_A.{ADAPTER}.weight"):
            fresh = torch.empty(param.shape)
            if cfg.lora_A_init == "xavier":
                std = math.sqrt(2.0 / (param.shape[0] + param.shape[1]))
                fresh.normal_(0.0, std, generator=generator)
            else:  # kaiming uniform with a = sqrt(5), PEFT's and nn.Linear's default
                bound = 1.0 / math.sqrt(param.shape[1])
                fresh.uniform_(-bound, bound, generator=generator)
            param.copy_(fresh)
        elif name.endswith(f"lora_B.{ADAPTER}.weight"):
            param.zero_()


def iter_merged(model: nn.Module, hf_names: list[str], scaling: float, rank: int,
                held: HeldBytes) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective generator: the merged model's full tensors under the base HF names, in
    `hf_names` order, on rank 0 (the other ranks yield nothing but must exhaust it)."""
    state = model.state_dict()
    for name in hf_names:
        stem = PREFIX + name.removesuffix(".weight")
        if stem + ".base_layer.weight" not in state:
            full = full_value(state[PREFIX + name])
            if rank == 0:
                yield name, held.track(full)
            del full
            continue
        base = full_value(state[stem + ".base_layer.weight"])
        a = full_value(state[f"{stem}.lora_A.{ADAPTER}.weight"])
        b = full_value(state[f"{stem}.lora_B.{ADAPTER}.weight"])
        if rank == 0:
            yield name, held.track(base.float() + scaling * (b.float() @ a.float()))
        del base, a, b


def _adapter_entries(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT's saved name, this rank's value) of every adapter tensor, in a fixed order: the name
    PEFT's save_pretrained writes (the adapter's own name dropped), which vLLM and
    `PeftModel.from_pretrained` read."""
    for name, value in model.state_dict().items():
        if ".lora_A." in name or ".lora_B." in name:
            yield name.replace(f".{ADAPTER}.", "."), value


def adapter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The adapters' saved names and full shapes, in `iter_adapters` order (the same on every rank)."""
    return {name: tuple(value.shape) for name, value in _adapter_entries(model)}


def iter_adapters(model: nn.Module, rank: int, held: HeldBytes) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective generator: the adapters' full tensors under their saved names, on rank 0 (the
    other ranks yield nothing but must exhaust it)."""
    for name, value in _adapter_entries(model):
        full = full_value(value)
        if rank == 0:
            yield name, held.track(full.detach())
        del full


def export_adapter(model: nn.Module, cfg: LoraSettings, model_name: str, out_dir: Path, rank: int) -> int:
    """Collective: write the adapters in PEFT's layout into `out_dir` (rank 0); returns how many
    tensors (0 elsewhere)."""
    from safetensors.torch import save_file

    tensors = {}
    for name, value in _adapter_entries(model):
        full = full_value(value)
        if rank == 0:
            tensors[name] = full.detach().to("cpu", torch.float32).contiguous()
    if rank != 0:
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_config(cfg, model_name).save_pretrained(str(out_dir))
    return len(tensors)
