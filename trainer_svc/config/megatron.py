"""`policy.megatron_cfg`: the Megatron backend's settings, in NeMo-RL's key names.

Pydantic only (imported by `trainer_svc.config` and the coordinator's config without loading
torch or megatron-core). Options that cannot run on a CPU-only machine are refused by the
backend at start (see `model.check_supported`), not here: the same YAML runs on GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class MegatronOptimizerSettings(_Strict):
    """`megatron_cfg.optimizer`: Megatron's OptimizerConfig. None: the value of `policy.optimizer`
    (lr, weight_decay, betas, eps) or `policy.max_grad_norm` (clip_grad)."""

    optimizer: Literal["adam", "sgd"] = "adam"
    """Megatron's optimizer (adam is AdamW: decoupled weight decay)."""
    lr: float | None = Field(None, gt=0)
    """Peak learning rate."""
    min_lr: float | None = Field(None, ge=0)
    """Floor of the decayed learning rate (None: 0)."""
    weight_decay: float | None = Field(None, ge=0)
    adam_beta1: float | None = Field(None, ge=0, lt=1)
    adam_beta2: float | None = Field(None, ge=0, lt=1)
    adam_eps: float | None = Field(None, gt=0)
    sgd_momentum: float = Field(0.9, ge=0)
    bf16: bool = False
    """Parameters and compute in bfloat16, fp32 main weights in the optimizer."""
    fp16: bool = False
    """float16 with loss scaling (refused on CPU)."""
    params_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """dtype of the main parameters (float32 only here)."""
    use_distributed_optimizer: bool = False
    """Shard the optimizer state over data-parallel ranks (ZeRO-1)."""
    use_precision_aware_optimizer: bool = False
    """TE's fused precision-aware Adam (refused: needs Transformer Engine)."""
    clip_grad: float | None = Field(None, gt=0)
    """Global gradient-norm clip."""


class MegatronSchedulerSettings(_Strict):
    """`megatron_cfg.scheduler`: Megatron's OptimizerParamScheduler, stepped once per optimizer step."""

    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "constant"
    lr_decay_iters: int | None = Field(None, gt=0)
    """Steps over which the learning rate decays to min_lr (None: 1000)."""
    lr_warmup_iters: int = Field(0, ge=0)
    lr_warmup_init: float = Field(0.0, ge=0)
    start_weight_decay: float | None = Field(None, ge=0)
    """None: optimizer.weight_decay."""
    end_weight_decay: float | None = Field(None, ge=0)
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"


class MegatronDdpSettings(_Strict):
    """`megatron_cfg.distributed_data_parallel_config`: Megatron's DistributedDataParallelConfig."""

    grad_reduce_in_fp32: bool = True
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    average_in_collective: bool = False
    """Must stay false: the losses are globally normalised and gradients are summed."""
    use_custom_fsdp: bool = False
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] = "no_shard"


class MegatronSettings(_Strict):
    """The Megatron-core backend (local layer spec GPTModel)."""

    enabled: bool = False
    """Train with Megatron-core (wins over dtensor_cfg when both are enabled)."""
    converter_type: str | None = None
    """Accepted for NeMo-RL compatibility; the family comes from the checkpoint's config.json."""
    empty_unused_memory_level: int = Field(0, ge=0, le=2)
    """Accepted for NeMo-RL compatibility (only matters on GPUs)."""
    tensor_model_parallel_size: int = Field(1, ge=1)
    pipeline_model_parallel_size: int = Field(1, ge=1)
    context_parallel_size: int = Field(1, ge=1)
    expert_model_parallel_size: int = Field(1, ge=1)
    expert_tensor_parallel_size: int | None = Field(None, ge=1)
    num_layers_in_first_pipeline_stage: int | None = Field(None, ge=1)
    num_layers_in_last_pipeline_stage: int | None = Field(None, ge=1)
    pipeline_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """dtype of pipeline p2p tensors (None: the compute dtype)."""
    sequence_parallel: bool = False
    """Split activations along the sequence over TP ranks outside attention/MLP (needs TP > 1)."""
    activation_checkpointing: bool = False
    """NeMo-RL's switch: full recomputation of every layer (recompute_* refine it)."""
    recompute_granularity: Literal["full", "selective"] | None = None
    """Megatron's recompute granularity (None: off, or full when activation_checkpointing)."""
    recompute_method: Literal["uniform", "block"] | None = None
    """How full recomputation picks layers (None with full: uniform)."""
    recompute_num_layers: int | None = Field(None, ge=1)
    """Layers per recomputed chunk (uniform) or recomputed layers per stage (block); None: 1."""
    apply_rope_fusion: bool = False
    """Fused RoPE kernel (needs Transformer Engine: refused on CPU)."""
    gradient_accumulation_fusion: bool = False
    """Fused wgrad accumulation (needs APEX CUDA extensions: refused on CPU)."""
    optimizer: MegatronOptimizerSettings = MegatronOptimizerSettings()
    scheduler: MegatronSchedulerSettings = MegatronSchedulerSettings()
    distributed_data_parallel_config: MegatronDdpSettings = MegatronDdpSettings()

    @model_validator(mode="after")
    def _consistent(self) -> MegatronSettings:
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("megatron_cfg.sequence_parallel needs tensor_model_parallel_size > 1")
        if self.recompute_method is not None and self.recompute_granularity == "selective":
            raise ValueError("megatron_cfg.recompute_method applies to recompute_granularity: full only")
        if self.optimizer.bf16 and self.optimizer.fp16:
            raise ValueError("megatron_cfg.optimizer: set at most one of bf16 and fp16")
        if self.distributed_data_parallel_config.average_in_collective:
            raise ValueError("megatron_cfg.distributed_data_parallel_config.average_in_collective must be false: "
                             "Tandem normalises losses globally and sums gradients over ranks")
        return self

    @property
    def recompute(self) -> tuple[str | None, str | None, int | None]:
        """(granularity, method, num_layers) as Megatron's TransformerConfig takes them."""
        granularity = self.recompute_granularity or ("full" if self.activation_checkpointing else None)
        if granularity != "full":
            return granularity, None, None
        return granularity, self.recompute_method or "uniform", self.recompute_num_layers or 1


def megatron_conversion_problem(hf_config: Mapping[str, Any]) -> str | None:
    """Why the Megatron backend cannot convert a checkpoint with this config.json (None: it can):
    the converter's own rule, asked before anything starts."""
    from types import SimpleNamespace

    from trainer_svc.config.arch import Arch

    try:
        Arch.from_hf_config(SimpleNamespace(**hf_config))
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        return str(exc)
    return None
