"""Megatron options that need a GPU (and Transformer Engine): which ones a run asks for, the
refusal that names them on a machine that cannot run them, and the Transformer Engine layer
spec they are built on.

On CPU the model is Megatron's local layer spec (torch modules). FP8 GEMMs, context-parallel
attention, fused RoPE and the fused MoE kernels exist only as Transformer Engine (or APEX,
DeepEP, grouped-GEMM) CUDA kernels, so a run that asks for one is refused at start, before any
collective, with every such key named. On a GPU with Transformer Engine the model is built on
TE's layer spec instead; its norms before attention and before a dense MLP are fused into the
next linear layer, so those two parameters change names (`te_name` / `local_name`); the
conversion and the export translate, everything else keeps its local-spec name.
"""

from __future__ import annotations

import importlib.util

from trainer_svc.config.megatron import MegatronSettings

# local-spec name tail -> Transformer Engine spec name tail (norms fused into the next linear)
_TE_TAILS = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
             "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def te_options(cfg: MegatronSettings) -> dict[str, str]:
    """Options of `cfg` that only run on Transformer Engine's CUDA layers: key -> what it needs."""
    wanted = {
        "fp8_cfg.enabled (FP8 GEMMs)": cfg.fp8_cfg.enabled,
        "context_parallel_size > 1 (ring attention)": cfg.context_parallel_size > 1,
        "apply_rope_fusion (fused RoPE kernel)": cfg.apply_rope_fusion,
        "moe_permute_fusion (fused token permutation)": cfg.moe_permute_fusion,
        "moe_grouped_gemm (grouped GEMM over the local experts)": cfg.moe_grouped_gemm,
        "optimizer.use_precision_aware_optimizer (TE's fused Adam)": cfg.optimizer.use_precision_aware_optimizer,
    }
    return {key.split(" (")[0]: key for key, on in wanted.items() if on}


def cuda_only_options(cfg: MegatronSettings) -> list[str]:
    """Options that need CUDA without Transformer Engine (APEX, DeepEP, CUDA streams, fp16 scaling)."""
    wanted = {
        "optimizer.fp16 (loss-scaled float16 needs CUDA)": cfg.optimizer.fp16,
        "gradient_accumulation_fusion (needs APEX CUDA extensions)": cfg.gradient_accumulation_fusion,
        "moe_token_dispatcher_type: flex / moe_enable_deepep (needs DeepEP)":
            cfg.moe_token_dispatcher_type == "flex" or cfg.moe_enable_deepep,
        "moe_shared_expert_overlap (needs CUDA streams)": cfg.moe_shared_expert_overlap,
    }
    return [key for key, on in wanted.items() if on]


def check_device(cfg: MegatronSettings, *, on_gpu: bool, te_available: bool | None = None,
                 capability: tuple[int, int] | None = None) -> None:
    """Raise ValueError naming every option this device cannot run and what it lacks."""
    te = te_options(cfg)
    if not on_gpu:
        bad = [*cuda_only_options(cfg), *(f"{text} needs Transformer Engine on a GPU" for text in te.values())]
        if bad:
            raise ValueError(f"megatron_cfg: {'; '.join(bad)}: this machine has no CUDA device; turn them off "
                             "(or run the trainer on GPUs)")
        return
    if te_available is None:
        te_available = importlib.util.find_spec("transformer_engine") is not None
    if te and not te_available:
        raise ValueError(f"megatron_cfg: {', '.join(te)} need Transformer Engine, which is not installed in the "
                         "trainer's environment (pip install transformer-engine[pytorch]); or turn them off")
    if cfg.moe_grouped_gemm:
        raise ValueError("megatron_cfg.moe_grouped_gemm: the converter maps SequentialMLP experts (one module per "
                         "expert), not grouped-GEMM weights; set it to false")
    if cfg.fp8_cfg.enabled:
        _check_fp8_device(cfg, capability)


def _check_fp8_device(cfg: MegatronSettings, capability: tuple[int, int] | None) -> None:
    if capability is None:
        import torch

        capability = torch.cuda.get_device_capability()
    needs = {"mxfp8": (10, 0), "blockwise": (9, 0)}.get(cfg.fp8_cfg.fp8_recipe, (8, 9))
    if capability < needs:
        raise ValueError(f"megatron_cfg.fp8_cfg: recipe {cfg.fp8_cfg.fp8_recipe!r} needs a GPU of compute capability "
                         f"{needs[0]}.{needs[1]} or newer (this one is {capability[0]}.{capability[1]}); use "
                         "fp8_recipe: tensorwise on Ada/Hopper, or fp8_cfg.enabled: false")


def uses_te(cfg: MegatronSettings, on_gpu: bool) -> bool:
    """Build on Transformer Engine's layer spec: on GPUs, when an option needs it."""
    return on_gpu and bool(te_options(cfg))


def layer_spec(num_experts: int | None, use_te: bool):
    """The GPT layer spec: local (torch) modules, or Transformer Engine's."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if use_te:
        return specs.get_gpt_layer_with_transformer_engine_spec(num_experts=num_experts, moe_grouped_gemm=False)
    return specs.get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False, normalization="RMSNorm")


def fp8_kwargs(cfg: MegatronSettings) -> dict:
    """TransformerConfig's FP8 fields (empty when FP8 is off)."""
    f = cfg.fp8_cfg
    return {"fp8": f.fp8, "fp8_recipe": f.fp8_recipe, "fp8_param": f.fp8_param} if f.enabled else {}


def te_name(local: str, moe_layer: bool) -> str:
    """The Transformer Engine spec's name of a local-spec parameter (a MoE layer keeps its own
    pre-MLP norm: only attention's input norm is fused there)."""
    for tail, te in _TE_TAILS.items():
        if local.endswith(tail) and not (moe_layer and tail.startswith("pre_mlp")):
            return local[: -len(tail)] + te
    return local


def local_name(name: str) -> str:
    """The local-spec name of a Transformer Engine spec parameter (inverse of `te_name`)."""
    for tail, te in _TE_TAILS.items():
        if name.endswith(te):
            return name[: -len(te)] + tail
    return name


def patch_router_without_te() -> None:
    """megatron-core 0.16.1's router GEMM (`moe_utils.RouterGatingLinearFunction`) tests
    `te_general_gemm is not None`, a name its module defines only when Transformer Engine imports:
    without TE every MoE forward raises NameError. Define it as None (the torch GEMM branch)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
