"""`policy.dtensor_cfg.lora_cfg`: LoRA adapters on the DTensor backend (NeMo-RL's keys).

Pydantic only. The backend wraps the policy with PEFT (trainer_svc/backends/dtensor/lora.py):
only the adapters train, are checkpointed and make the reference policy's difference. The
generators receive (`weight_sync`) the merged weights (W + alpha/dim * B A) under the base model's
HF names, or the adapters alone, which they serve through vLLM's LoRA support over the base
weights they loaded at start (generator_svc/engines/served_weights.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LoraWeightSync(StrEnum):
    """What a weight publish carries to the generators when LoRA trains (chosen at config load)."""

    MERGED = "merged"
    """The whole merged model under the base HF names; generators serve it as a plain model."""
    ADAPTER = "adapter"
    """The adapters alone (A and B of every adapted layer, PEFT's names); generators keep the base
    weights they started with and serve every request through vLLM's LoRA layers."""


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    enabled: bool = False
    """Train LoRA adapters instead of the full model."""
    target_modules: tuple[str, ...] = ()
    """Module names (or name suffixes, PEFT's matching) that get adapters, e.g. [q_proj, v_proj]."""
    exclude_modules: tuple[str, ...] = ()
    """Module names left without adapters."""
    match_all_linear: bool = True
    """Adapters on every linear layer except the output head (overrides target_modules)."""
    dim: int = Field(8, ge=1)
    """The adapters' rank r."""
    alpha: float = Field(32, gt=0)
    """Scale: the adapter's update is alpha / dim * B A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input. > 0 makes training forwards differ from scoring ones, so
    the trainer then scores a step's previous logprobs in a pass of their own."""
    dropout_position: Literal["pre", "post"] = "post"
    """Where NeMo-RL applies the dropout; PEFT applies it before the adapter (pre), so with
    dropout > 0 only "pre" is accepted (with dropout 0 both mean the same)."""
    lora_A_init: Literal["xavier", "uniform"] = "xavier"
    """Initialisation of A (B starts at zero, so the adapted model starts as the base model):
    xavier normal, or kaiming uniform (PEFT's default)."""
    weight_sync: LoraWeightSync = LoraWeightSync.MERGED
    """What the generators receive at each publish: merged (the default: the whole model, served
    at the base model's speed) or adapter (the adapters alone: a publish of a few MB instead of the
    model's size, served through vLLM's LoRA layers, which cost generation time: measured 5.6x
    slower generation on vLLM-CPU, benchmarks/lora_sync.py; GPUs run them with vLLM's LoRA kernels). Adapter
    needs dedicated generator services (policy.generation.backend: vllm, not colocated); they receive
    it over the weight-sync group, or by CUDA IPC where they share the trainer's only GPU."""
    use_triton: bool = True
    """Accepted for NeMo-RL compatibility: Triton LoRA kernels are not used (PEFT's torch layers run everywhere)."""

    @model_validator(mode="after")
    def _consistent(self) -> LoraSettings:
        if not self.enabled:
            if self.weight_sync is LoraWeightSync.ADAPTER:
                raise ValueError("lora_cfg.weight_sync: adapter sends LoRA adapters, which only exist with "
                                 "lora_cfg.enabled: true: enable LoRA, or remove weight_sync")
            return self
        if not self.match_all_linear and not self.target_modules:
            raise ValueError("lora_cfg: set target_modules (e.g. [q_proj, v_proj]) or match_all_linear: true")
        if self.dropout > 0 and self.dropout_position == "post":
            raise ValueError("lora_cfg.dropout_position: post is not available (PEFT drops the adapter's input): "
                             "set dropout_position: pre, or dropout: 0")
        return self

    @property
    def scaling(self) -> float:
        return self.alpha / self.dim
