"""`policy.megatron_cfg`: the Megatron backend's settings, in NeMo-RL's key names.

Pydantic only (imported by `trainer_svc.config` and the coordinator's config without loading
torch or megatron-core). Options that cannot run on a CPU-only machine are refused by the
backend at start (see `model.check_supported` and `gpu_features.check_gpu_features`), not
here: the same YAML runs on GPUs. What is checked here is what no device could run (an FP8
recipe Megatron does not know, an FP8 key without `fp8_cfg.enabled`, ...).
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
    """Decoupled weight decay."""
    adam_beta1: float | None = Field(None, ge=0, lt=1)
    """Adam's first-moment decay."""
    adam_beta2: float | None = Field(None, ge=0, lt=1)
    """Adam's second-moment decay."""
    adam_eps: float | None = Field(None, gt=0)
    """Adam's epsilon."""
    sgd_momentum: float = Field(0.9, ge=0)
    """Momentum of the sgd optimizer."""
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
    """Shape of the decay from lr to min_lr after the warmup."""
    lr_decay_iters: int | None = Field(None, gt=0)
    """Steps over which the learning rate decays to min_lr (None: 1000)."""
    lr_warmup_iters: int = Field(0, ge=0)
    """Steps of linear warmup from lr_warmup_init to lr."""
    lr_warmup_init: float = Field(0.0, ge=0)
    """Learning rate at the first warmup step."""
    start_weight_decay: float | None = Field(None, ge=0)
    """None: optimizer.weight_decay."""
    end_weight_decay: float | None = Field(None, ge=0)
    """Weight decay at the end of lr_decay_iters (None: optimizer.weight_decay)."""
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"
    """How weight decay moves from start_weight_decay to end_weight_decay."""


class MegatronDdpSettings(_Strict):
    """`megatron_cfg.distributed_data_parallel_config`: Megatron's DistributedDataParallelConfig."""

    grad_reduce_in_fp32: bool = True
    """Reduce gradients across data-parallel ranks in float32."""
    overlap_grad_reduce: bool = False
    """Overlap the gradient reduction with the backward pass."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the forward pass."""
    average_in_collective: bool = False
    """Must stay false: the losses are globally normalised and gradients are summed."""
    use_custom_fsdp: bool = False
    """Megatron's custom FSDP: refused (must stay false)."""
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] = "no_shard"
    """Accepted for NeMo-RL compatibility (custom FSDP's sharding; unused here)."""


class Fp8Settings(_Strict):
    """`megatron_cfg.fp8_cfg` (NeMo-RL's keys): FP8 GEMMs through Transformer Engine's layers.
    GPU only (Hopper or newer, Transformer Engine installed): refused at start elsewhere."""

    enabled: bool = False
    """Train the linear layers' GEMMs in FP8 (the model is then built on Transformer Engine's layer spec)."""
    fp8: Literal["e4m3", "hybrid"] = "e4m3"
    """FP8 format: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients)."""
    fp8_recipe: Literal["tensorwise", "delayed", "blockwise", "mxfp8"] = "blockwise"
    """Scaling recipe (Megatron's Fp8Recipe): blockwise needs Hopper, mxfp8 Blackwell."""
    fp8_param: bool = False
    """Keep the parameters themselves in FP8 (mxfp8/blockwise gathers in FP8)."""
    force_clear_fp8_caches: bool = False
    """Accepted for NeMo-RL compatibility (its GPU memory offload before refit; nothing to clear here)."""

    @model_validator(mode="after")
    def _param_needs_enabled(self) -> Fp8Settings:
        if self.fp8_param and not self.enabled:
            raise ValueError("megatron_cfg.fp8_cfg.fp8_param needs fp8_cfg.enabled: true")
        return self


class MegatronSettings(_Strict):
    """The Megatron-core backend (local layer spec GPTModel)."""

    enabled: bool = False
    """Train with Megatron-core (wins over dtensor_cfg when both are enabled)."""
    converter_type: str | None = None
    """Accepted for NeMo-RL compatibility; the family comes from the checkpoint's config.json."""
    empty_unused_memory_level: int = Field(0, ge=0, le=2)
    """Accepted for NeMo-RL compatibility (only matters on GPUs)."""
    tensor_model_parallel_size: int = Field(1, ge=1)
    """Tensor-parallel ranks (TP)."""
    pipeline_model_parallel_size: int = Field(1, ge=1)
    """Pipeline stages (PP)."""
    context_parallel_size: int = Field(1, ge=1)
    """Context-parallel ranks (CP; GPU only: Transformer Engine's ring attention)."""
    expert_model_parallel_size: int = Field(1, ge=1)
    """Expert-parallel ranks of mixture-of-experts layers (EP)."""
    expert_tensor_parallel_size: int | None = Field(None, ge=1)
    """Tensor-parallel ranks inside each expert (ETP; None: tensor_model_parallel_size)."""
    num_layers_in_first_pipeline_stage: int | None = Field(None, ge=1)
    """Layers of the first pipeline stage; uneven stages are refused (None: an even split)."""
    num_layers_in_last_pipeline_stage: int | None = Field(None, ge=1)
    """Layers of the last pipeline stage; uneven stages are refused (None: an even split)."""
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
    bias_activation_fusion: bool = False
    """Fused SwiGLU of the MLP (Megatron's jit-scripted kernel: runs on CPU and GPU)."""
    freeze_moe_router: bool = False
    """Mixture-of-experts: keep every router's weights fixed (no gradient, not in the optimizer)."""
    moe_router_dtype: Literal["fp32", "fp64"] | None = None
    """dtype of the router's logits and softmax (None: the compute dtype)."""
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "none"] = "none"
    """Load-balancing loss of the routers, weighted by the checkpoint's router_aux_loss_coef and
    reported as moe_<type> (e.g. moe_load_balancing_loss); none: neither applied nor reported."""
    moe_router_bias_update_rate: float = Field(0.0, ge=0)
    """Expert-bias update rate (only models with an expert bias use it; the supported families have none)."""
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = "allgather"
    """How tokens reach the experts of other expert-parallel ranks (flex needs DeepEP: GPU only)."""
    moe_permute_fusion: bool = False
    """Fused token permutation (Transformer Engine: refused on CPU)."""
    moe_grouped_gemm: bool = False
    """Grouped GEMM over the local experts (TE/CUTLASS: refused on CPU)."""
    moe_enable_deepep: bool = False
    """DeepEP all-to-all (needs moe_token_dispatcher_type: flex; GPU only)."""
    moe_shared_expert_overlap: bool = False
    """Overlap the shared expert with the dispatch on CUDA streams (needs alltoall; GPU only)."""
    moe_per_layer_logging: bool = False
    """Also report the load-balancing loss per layer (moe_<type>_layer_<i>)."""
    fp8_cfg: Fp8Settings = Fp8Settings()
    """FP8 training (GPU only)."""
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
        if self.moe_enable_deepep and self.moe_token_dispatcher_type != "flex":
            raise ValueError("megatron_cfg.moe_enable_deepep needs moe_token_dispatcher_type: flex")
        if self.moe_shared_expert_overlap and self.moe_token_dispatcher_type != "alltoall":
            raise ValueError("megatron_cfg.moe_shared_expert_overlap needs moe_token_dispatcher_type: alltoall")
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
