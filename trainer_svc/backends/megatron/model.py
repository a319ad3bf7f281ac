"""Build the Megatron side of the backend: model-parallel groups, the TransformerConfig of an
HF Llama/Qwen2 architecture (or a mixture-of-experts one, moe.py), the local-spec GPTModel of
this rank's stage (Transformer Engine's spec on GPUs when an option needs it: gpu_features.py)
wrapped in Megatron DDP, and Megatron's optimizer with its LR/weight-decay scheduler.

`perform_initialization` stays True although the weights are then overwritten by the
converted checkpoint: megatron-core 0.16.x only marks TP-sharded weights as
`tensor_model_parallel` in its init branches, and `get_grad_norm` skips unmarked shards, so
skipping init makes the TP>1 grad norm (and clipping) wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer_svc.backends.megatron import cpu_compat, gpu_features
from trainer_svc.backends.megatron.convert import Arch, Shard
from trainer_svc.backends.megatron.moe import ExpertShard, is_moe
from trainer_svc.config.megatron import MegatronSettings


@dataclass(frozen=True)
class Layout:
    """The rank's coordinates in Megatron's tp-cp-ep-dp-pp grid."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    edp_rank: int = 0
    """Rank among the replicas of this rank's experts (expert data parallel)."""
    cp_rank: int = 0

    @property
    def experts(self) -> ExpertShard:
        return ExpertShard(self.ep_rank, self.ep_size, self.etp_rank, self.etp_size)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1


def check_supported(cfg: MegatronSettings, arch: Arch, world_size: int, on_gpu: bool) -> None:
    """Raise ValueError, naming the key, for a layout or option that cannot run here."""
    tp, pp, cp = cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size
    if world_size % (tp * pp * cp):
        raise ValueError(f"{world_size} trainer ranks are not a multiple of megatron_cfg tensor ({tp}) x pipeline "
                         f"({pp}) x context ({cp}) parallel sizes: change the sizes or cluster.trainer_ranks")
    if arch.num_layers % pp:
        raise ValueError(f"the model's {arch.num_layers} layers do not split evenly into "
                         f"megatron_cfg.pipeline_model_parallel_size={pp} stages")
    if arch.num_kv_heads % tp:
        raise ValueError(f"megatron_cfg.tensor_model_parallel_size={tp} must divide the {arch.num_kv_heads} "
                         "key/value heads")
    if is_moe(arch):
        _check_moe_layout(cfg, arch, world_size)
    elif cfg.expert_model_parallel_size > 1 or (cfg.expert_tensor_parallel_size or 1) > 1:
        raise ValueError(f"megatron_cfg.expert_model_parallel_size / expert_tensor_parallel_size > 1 need a "
                         f"mixture-of-experts model; {arch.family} is dense: set them to 1")
    if cfg.num_layers_in_first_pipeline_stage or cfg.num_layers_in_last_pipeline_stage:
        raise ValueError("megatron_cfg.num_layers_in_first/last_pipeline_stage: uneven stages are not supported; "
                         "leave them null")
    if cfg.distributed_data_parallel_config.use_custom_fsdp:
        raise ValueError("megatron_cfg.distributed_data_parallel_config.use_custom_fsdp is not supported; set it false")
    if cfg.optimizer.params_dtype != "float32":
        raise ValueError("megatron_cfg.optimizer.params_dtype must be float32 (use optimizer.bf16 for bf16 compute)")
    gpu_features.check_device(cfg, on_gpu=on_gpu)


def _check_moe_layout(cfg: MegatronSettings, arch: Arch, world_size: int) -> None:
    tp, pp, ep = cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.expert_model_parallel_size
    etp = cfg.expert_tensor_parallel_size or tp
    if arch.moe.num_experts % ep:
        raise ValueError(f"megatron_cfg.expert_model_parallel_size={ep} must divide the model's "
                         f"{arch.moe.num_experts} experts")
    if world_size % (etp * ep * pp):
        raise ValueError(f"{world_size} trainer ranks are not a multiple of megatron_cfg expert_tensor ({etp}) x "
                         f"expert_model ({ep}) x pipeline ({pp}) parallel sizes: change the sizes or cluster.trainer_ranks")
    if arch.moe.expert_ffn % etp or arch.moe.shared_ffn % tp:
        raise ValueError(f"the experts' width {arch.moe.expert_ffn} (shared expert: {arch.moe.shared_ffn}) must split "
                         f"evenly over expert_tensor_parallel_size={etp} (tensor_model_parallel_size={tp})")
    if tp > 1 and not cfg.sequence_parallel:
        raise ValueError("megatron_cfg.sequence_parallel must be true with a mixture-of-experts model at "
                         "tensor_model_parallel_size > 1 (Megatron's MoE layer needs it)")
    if pp > 1 or cfg.context_parallel_size > 1:
        raise ValueError("megatron_cfg.pipeline_model_parallel_size / context_parallel_size > 1 with a "
                         "mixture-of-experts model are not supported yet (the expert export runs within one stage, "
                         "the routers' loss is normalised without CP): set them to 1")


def init_model_parallel(cfg: MegatronSettings, seed: int) -> Layout:
    """Megatron's process groups over the default (already initialised) group, and its RNG."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    cpu_compat.install()
    ps.initialize_model_parallel(tensor_model_parallel_size=cfg.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
                                 context_parallel_size=cfg.context_parallel_size,
                                 expert_model_parallel_size=cfg.expert_model_parallel_size,
                                 expert_tensor_parallel_size=cfg.expert_tensor_parallel_size)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return Layout(ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(),
                  ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size(),
                  ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(),
                  ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size(),
                  ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size(),
                  ps.get_expert_data_parallel_rank(), ps.get_context_parallel_rank())


def destroy_model_parallel() -> None:
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()


def compute_dtype(cfg: MegatronSettings, trainer_dtype: str) -> torch.dtype:
    return torch.bfloat16 if cfg.optimizer.bf16 or trainer_dtype == "bfloat16" else torch.float32


def transformer_config(arch: Arch, cfg: MegatronSettings, dtype: torch.dtype, *, cpu_initialization: bool = True):
    """`cpu_initialization`: ModelPlacement.cpu_initialization (False on CUDA: placement.py)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    granularity, method, num_layers = cfg.recompute
    pipeline_dtype = getattr(torch, cfg.pipeline_dtype) if cfg.pipeline_dtype else dtype
    return TransformerConfig(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size, ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads, num_query_groups=arch.num_kv_heads, kv_channels=arch.head_dim,
        normalization="RMSNorm", layernorm_epsilon=arch.norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=arch.qkv_bias, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
        context_parallel_size=cfg.context_parallel_size, sequence_parallel=cfg.sequence_parallel,
        recompute_granularity=granularity, recompute_method=method, recompute_num_layers=num_layers,
        use_cpu_initialization=cpu_initialization, perform_initialization=True, params_dtype=dtype, pipeline_dtype=pipeline_dtype,
        bf16=dtype == torch.bfloat16, gradient_accumulation_fusion=cfg.gradient_accumulation_fusion,
        apply_rope_fusion=cfg.apply_rope_fusion, masked_softmax_fusion=False,
        bias_activation_fusion=cfg.bias_activation_fusion, bias_dropout_fusion=False, persist_layer_norm=False,
        calculate_per_token_loss=True, deallocate_pipeline_outputs=False, **_moe_kwargs(arch, cfg),
        **gpu_features.fp8_kwargs(cfg))


def _moe_kwargs(arch: Arch, cfg: MegatronSettings) -> dict:
    """TransformerConfig's mixture-of-experts fields (empty for a dense model)."""
    if not is_moe(arch):
        return {}
    m, balancing = arch.moe, cfg.moe_router_load_balancing_type
    return dict(
        num_moe_experts=m.num_experts, moe_router_topk=m.topk, moe_ffn_hidden_size=m.expert_ffn,
        moe_shared_expert_intermediate_size=m.shared_ffn or None, moe_shared_expert_gate=bool(m.shared_ffn),
        moe_router_pre_softmax=m.pre_softmax, moe_router_load_balancing_type=balancing,
        moe_aux_loss_coeff=m.aux_loss_coeff if balancing != "none" else 0.0, moe_router_dtype=cfg.moe_router_dtype,
        moe_router_bias_update_rate=cfg.moe_router_bias_update_rate,
        moe_token_dispatcher_type=cfg.moe_token_dispatcher_type, moe_permute_fusion=cfg.moe_permute_fusion,
        moe_grouped_gemm=cfg.moe_grouped_gemm, moe_enable_deepep=cfg.moe_enable_deepep,
        moe_shared_expert_overlap=cfg.moe_shared_expert_overlap, moe_per_layer_logging=cfg.moe_per_layer_logging,
        expert_model_parallel_size=cfg.expert_model_parallel_size,
        expert_tensor_parallel_size=cfg.expert_tensor_parallel_size)


def shard_of(arch: Arch, layout: Layout) -> Shard:
    per_stage = arch.num_layers // layout.pp_size
    return Shard(layout.tp_rank, layout.tp_size, layout.pp_rank * per_stage, per_stage, layout.is_first_stage,
                 layout.is_last_stage, arch.padded_vocab(layout.tp_size))


def build_gpt_model(arch: Arch, config, layout: Layout, *, use_te: bool = False):
    """This rank's stage of the GPTModel (full logits: `parallel_output=False` gathers the vocab)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    spec = gpu_features.layer_spec(arch.moe.num_experts if is_moe(arch) else None, use_te)
    return GPTModel(config=config, transformer_layer_spec=spec,
                    vocab_size=arch.padded_vocab(layout.tp_size), max_sequence_length=arch.max_position_embeddings,
                    pre_process=layout.is_first_stage, post_process=layout.is_last_stage, parallel_output=False,
                    share_embeddings_and_output_weights=arch.tie_word_embeddings, position_embedding_type="rope",
                    rotary_base=arch.rope_theta)


def freeze_routers(model) -> int:
    """freeze_moe_router: every MoE router's weights get no gradient (so Megatron's DDP and
    optimizer leave them out); returns how many were frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        if name.endswith((".mlp.router.weight", ".mlp.router.expert_bias")):
            param.requires_grad = False
            frozen += 1
    return frozen


def wrap_ddp(model, config, cfg: MegatronSettings):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp = cfg.distributed_data_parallel_config
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=ddp.grad_reduce_in_fp32, overlap_grad_reduce=ddp.overlap_grad_reduce,
        overlap_param_gather=ddp.overlap_param_gather, average_in_collective=False,
        use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer)
    return DistributedDataParallel(config, ddp_config, model)


@dataclass(frozen=True)
class OptimizerDefaults:
    """policy.optimizer / policy.max_grad_norm values for megatron_cfg.optimizer keys left None."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    max_grad_norm: float | None


def build_optimizer(ddp_model, cfg: MegatronSettings, defaults: OptimizerDefaults, dtype: torch.dtype):
    """Megatron's optimizer over the DDP model and its OptimizerParamScheduler (already at step 0)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    o, s = cfg.optimizer, cfg.scheduler
    lr = o.lr if o.lr is not None else defaults.lr
    weight_decay = o.weight_decay if o.weight_decay is not None else defaults.weight_decay
    clip = o.clip_grad if o.clip_grad is not None else defaults.max_grad_norm
    config = OptimizerConfig(
        optimizer=o.optimizer, lr=lr, min_lr=o.min_lr or 0.0, weight_decay=weight_decay,
        adam_beta1=o.adam_beta1 if o.adam_beta1 is not None else defaults.betas[0],
        adam_beta2=o.adam_beta2 if o.adam_beta2 is not None else defaults.betas[1],
        adam_eps=o.adam_eps if o.adam_eps is not None else defaults.eps, sgd_momentum=o.sgd_momentum,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, use_distributed_optimizer=o.use_distributed_optimizer,
        clip_grad=clip if clip is not None else math.inf)  # inf: the norm is still computed and reported
    optimizer = get_megatron_optimizer(config, [ddp_model])
    decay_iters = s.lr_decay_iters or 1000
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=s.lr_warmup_init, max_lr=lr, min_lr=o.min_lr or 0.0, lr_warmup_steps=s.lr_warmup_iters,
        lr_decay_steps=max(decay_iters, s.lr_warmup_iters + 1), lr_decay_style=s.lr_decay_style,
        start_wd=s.start_weight_decay if s.start_weight_decay is not None else weight_decay,
        end_wd=s.end_weight_decay if s.end_weight_decay is not None else weight_decay,
        wd_incr_steps=max(decay_iters, 1), wd_incr_style=s.weight_decay_incr_style)
    return optimizer, scheduler
