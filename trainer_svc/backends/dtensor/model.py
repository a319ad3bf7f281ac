"""Build the sharded policy from an HF checkpoint directory.

Order (each step is needed by the next):
1. Every rank builds the architecture on the meta device (no memory, no init cost).
2. Tensor (and sequence) parallelism over the mesh's "tp" axis when tp > 1 (parallel.py).
3. Activation checkpointing wraps each decoder layer (before sharding, as FSDP2 requires).
4. `fully_shard` each decoder layer, then the root, over the mesh's "dp" axis. The root
   reshards after forward too (FSDP2 keeps it unsharded by default), so swapping the
   sharded storage (reference policy) never leaves stale gathered weights behind.
   Except on a single rank training in float32 without CPU offload (`needs_fsdp`): FSDP2
   would shard nothing there but still copy every layer's parameters into buffers of its own
   before each forward and again before each backward, and the gradients out of them.
5. `to_empty` allocates this rank's shards (on the CPU under FSDP2's CPU offload, which
   requires it: parallel.materialization); rank 0 loads the checkpoint and
   `set_model_state_dict(broadcast_from_rank0=True)` scatters it.
6. Non-persistent buffers (rotary `inv_freq`) are not in any state dict and `to_empty`
   leaves them as garbage: rank 0 copies them from its loaded model and broadcasts them; then
   every buffer goes to the compute device.
7. Gradients are reduced as a plain SUM (divide factor 1): losses are normalised globally.
With LoRA (lora.py) the model is wrapped with PEFT's adapters right after step 1, on every rank
and on rank 0's loaded copy alike, so both state dicts have the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from trainer_svc.backends.dtensor import lora
from trainer_svc.backends.dtensor.parallel import (
    MeshAxis,
    ParallelDims,
    apply_tensor_parallel,
    check_tensor_parallel,
    materialization,
)
from trainer_svc.config import ModelHead
from trainer_svc.config.lora import LoraSettings
from trainer_svc.distributed import DistEnv
from trainer_svc.hf import head_config


@dataclass
class ShardedPolicy:
    """The policy module (FSDP2) and the facts about it that the engine reports."""

    model: nn.Module
    vocab_size: int
    pad_id: int
    hf_tensor_shapes: dict[str, tuple[int, ...]]
    num_parameters: int
    checkpoint_dtype: torch.dtype


def load_sharded_policy(model_dir: str, *, env: DistEnv, mesh: DeviceMesh, dims: ParallelDims,
                        compute_dtype: torch.dtype, activation_checkpointing: bool,
                        offload_policy: OffloadPolicy | None = None,
                        head: ModelHead = ModelHead.LM, lora_cfg: LoraSettings | None = None,
                        seed: int = 0, custom_plan: dict | None = None) -> ShardedPolicy:
    """Load `model_dir` (any AutoModelForCausalLM checkpoint) sharded over the (dp, tp) `mesh`;
    with a SEQUENCE_SCORE `head`, as a one-output AutoModelForSequenceClassification (a reward
    model; see `trainer_svc.hf.classifier_config`); with TOKEN_VALUE, as a one-output
    AutoModelForTokenClassification (a PPO critic, `trainer_svc.hf.value_model_config`) whose
    fresh head starts at zero."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"model_name {model_dir!r} is not an HF checkpoint directory (no config.json)")
    config = head_config(model_dir, head) or AutoConfig.from_pretrained(model_dir)
    auto_class = {ModelHead.LM: AutoModelForCausalLM, ModelHead.SEQUENCE_SCORE: AutoModelForSequenceClassification,
                  ModelHead.TOKEN_VALUE: AutoModelForTokenClassification}[head]
    sequence_classifier = head is not ModelHead.LM
    checkpoint_dtype = _config_dtype(config)
    with torch.device("meta"):
        model = auto_class.from_config(config, dtype=torch.float32)
    hf_shapes = _hf_tensor_shapes(model)
    num_parameters = sum(p.numel() for p in model.parameters())
    vocab_size = int(model.get_input_embeddings().weight.shape[0])
    adapters = lora_cfg is not None and lora_cfg.enabled
    if adapters:
        model = lora.wrap(model, lora_cfg)
    buffers = [(f"{mod_name}.{b}" if mod_name else b, module, b) for mod_name, module in model.named_modules()
               for b in module._non_persistent_buffers_set if module._buffers.get(b) is not None]
    layers = _decoder_layers(model)
    if dims.tp > 1:
        if sequence_classifier:
            raise ValueError("a reward model (policy.reward_model_cfg.enabled) trains without tensor parallel; "
                             "set policy.dtensor_cfg.tensor_parallel_size=1")
        check_tensor_parallel(config, dims.tp)
        if custom_plan is not None:  # dtensor_cfg.custom_parallel_plan (NeMo-RL's form)
            parallelize_module(model, mesh[MeshAxis.TP], custom_plan)
        else:
            apply_tensor_parallel(model, layers, mesh[MeshAxis.TP], sequence_parallel=dims.sequence_parallel)
    if activation_checkpointing:
        layer_ids = {id(layer) for layer in layers}
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: id(m) in layer_ids)
    if needs_fsdp(env.world_size, compute_dtype, offload_policy):
        _fully_shard(model, layers, mesh[MeshAxis.DP], compute_dtype, offload_policy)
    where = materialization(env.device, isinstance(offload_policy, CPUOffloadPolicy))
    tied = _tied_parameters(model)
    model.to_empty(device=where.params)

    def load_full() -> nn.Module:  # rank 0 only
        loaded, info = auto_class.from_pretrained(model_dir, config=config, dtype=torch.float32,
                                                  output_loading_info=True)
        if head is ModelHead.TOKEN_VALUE and any(k.startswith("score.") for k in info["missing_keys"]):
            with torch.no_grad():  # a fresh value head: every value starts at 0 (HF draws it at random)
                for param in loaded.score.parameters():
                    param.zero_()
        if adapters:
            loaded = lora.wrap(loaded, lora_cfg)
            lora.init_adapters(loaded, lora_cfg, seed)
        return loaded

    _fill_from_rank0(model, load_full, buffers, env.rank)
    _retie(tied)  # a plain (unsharded) model's to_empty and load give each name a Parameter of its own
    _move_buffers(model, where.buffers)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    pad_id = config.pad_token_id if isinstance(config.pad_token_id, int) else 0
    return ShardedPolicy(model, vocab_size, pad_id, hf_shapes, num_parameters, checkpoint_dtype)


def needs_fsdp(world_size: int, compute_dtype: torch.dtype, offload_policy: OffloadPolicy | None) -> bool:
    """Whether the model is wrapped with FSDP2: always across ranks, and on one rank for what only
    FSDP2 gives there, its mixed precision (float32 parameters computed in a 16-bit dtype) and CPU
    offload. A one-rank float32 model runs plain: FSDP2 would gather each layer's parameters into
    a copy before its forward and again before its backward (reshard_after_forward) and reduce
    the gradients through one more (measured at Qwen2.5-0.5B's shape, 32 x 15 tokens, forward
    and backward: 28-33 s of CPU time against 24-25 s plain, 2.2M page faults against 0.7M).
    The numbers are the same either way: one rank's gather and reduction are copies."""
    return world_size > 1 or compute_dtype != torch.float32 or isinstance(offload_policy, CPUOffloadPolicy)


def _fully_shard(model: nn.Module, layers: list[nn.Module], dp_mesh: DeviceMesh, compute_dtype: torch.dtype,
                 offload_policy: OffloadPolicy | None) -> None:
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    shard = partial(fully_shard, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=True,
                    offload_policy=offload_policy or OffloadPolicy())
    for layer in layers:
        shard(layer)
    shard(model)


def _fill_from_rank0(model: nn.Module, load_full, buffers: list, rank: int) -> None:
    """Rank 0 loads the full model (`load_full()`); its state dict is scattered into the shards
    and the non-persistent buffers (not in any state dict) are broadcast."""
    full_state, full_buffers = {}, {}
    if rank == 0:
        loaded = load_full()
        full_state = loaded.state_dict()
        full_buffers = dict(loaded.named_buffers())
    set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, module, buffer_name in buffers:
            tensor = module._buffers[buffer_name]
            if rank == 0:
                tensor.copy_(full_buffers[name])
            dist.broadcast(tensor, src=0)


def _tied_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (module, attribute) places of each parameter held in more than one place (a tied
    embedding and LM head), in module order."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            places.setdefault(id(param), []).append((module, name))
    return [group for group in places.values() if len(group) > 1]


def _retie(groups: list[list[tuple[nn.Module, str]]]) -> None:
    """Make every place of each group hold its first place's Parameter again. In a plain model (one
    rank, no FSDP2: `needs_fsdp`) `to_empty` from the meta device and the full state dict's load
    give each name a Parameter of its own, which unties an embedding from its LM head: they would
    train apart and be saved twice. FSDP2 keeps one sharded parameter per tie: nothing changes."""
    for (first_module, first_name), *rest in groups:
        shared = getattr(first_module, first_name)
        for module, name in rest:
            if getattr(module, name) is not shared:
                setattr(module, name, shared)


def _move_buffers(model: nn.Module, device: torch.device) -> None:
    """Every buffer to `device` (after the fill: the state dict's broadcast wants one device)."""
    for module in model.modules():
        for name, tensor in module._buffers.items():
            if tensor is not None and tensor.device != device:
                module._buffers[name] = tensor.to(device)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks HF names in `_no_split_modules` (e.g. LlamaDecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no decoder-layer class (_no_split_modules); "
                         "cannot shard it per layer")
    return layers


def _hf_tensor_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """State-dict names and shapes, leaving out tied duplicates (as save_pretrained does)."""
    seen: set[int] = set()
    shapes = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        shapes[name] = tuple(tensor.shape)
    return shapes


def _config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def dropout_free(model: torch.nn.Module) -> bool:
    """Whether training runs the same forward as scoring: no Dropout module with p > 0, and no
    dropout probability > 0 in the HF config (attention dropout is functional, read from it)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return False
    config = getattr(model, "config", None)
    values = config.to_dict().items() if config is not None else ()
    return not any("dropout" in key and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                   for key, v in values)
