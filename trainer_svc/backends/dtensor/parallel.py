"""Parallel layout of the DTensor backend: the (dp, tp) mesh, tensor/sequence parallelism of
HF Llama-style decoders, and a gradient clip that is correct over parameters on several meshes.

Tensor parallel (Megatron-style, `parallelize_module` on the "tp" axis):
- attention q/k/v and MLP gate/up are column-parallel (heads and the MLP width split across
  tp ranks), attention o and MLP down are row-parallel (their partial outputs summed);
- the embedding is row-parallel over the vocabulary, the LM head column-parallel over the
  vocabulary with its logits gathered, so every tp rank sees full [B, T, V] logits;
- with sequence parallel, the residual stream between blocks (and the norms) is sharded over
  the sequence axis: row-parallel outputs are reduce-scattered along T instead of all-reduced,
  and each block's input is all-gathered along T. T must then be a multiple of the tp size
  (the backend pads). The residual stream stays a DTensor of global shape, so HF's mask
  code sees the full sequence length.
FSDP2 then shards every parameter over "dp" (TP parameters become 2-D DTensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class MeshAxis(StrEnum):
    DP = "dp"
    TP = "tp"


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of parallelism; dp is what is left of the world after tp."""

    world_size: int
    tp: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1 or self.world_size % self.tp:
            raise ValueError(f"dtensor_cfg.tensor_parallel_size ({self.tp}) must divide the number of trainer "
                             f"ranks ({self.world_size}): change one of them")

    @property
    def dp(self) -> int:
        return self.world_size // self.tp

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """2-D mesh (dp, tp); rank = dp_index * tp + tp_index, so a tp group is consecutive ranks."""
        return init_device_mesh(device_type, (self.dp, self.tp), mesh_dim_names=(MeshAxis.DP, MeshAxis.TP))



def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's values of a parameter or gradient: a DTensor's local shard, else the tensor
    itself (a one-rank float32 model runs without FSDP2: model.needs_fsdp)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, detached: a DTensor gathered (a collective: every rank calls it), else itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()

def check_tensor_parallel(config, tp: int) -> None:
    """Raise ValueError when the model's heads do not split over `tp` ranks."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % tp or kv_heads % tp:
        raise ValueError(f"tensor_parallel_size {tp} must divide the model's attention heads ({heads}) and "
                         f"key/value heads ({kv_heads}): choose a divisor of both")


def apply_tensor_parallel(model: nn.Module, layers: list[nn.Module], tp_mesh: DeviceMesh, *,
                          sequence_parallel: bool) -> None:
    """Shard `model` (an HF causal LM with Llama-style `layers`) over `tp_mesh` (module doc)."""
    backbone = model.get_decoder()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is backbone.embed_tokens.weight
    seq = Shard(1) if sequence_parallel else Replicate()
    parallelize_module(backbone, tp_mesh, {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq,
                                        use_local_output=not sequence_parallel),
        **({"norm": SequenceParallel()} if sequence_parallel else {}),
    })
    parallelize_module(model, tp_mesh, {
        _path(model, head): ColwiseParallel(input_layouts=seq, output_layouts=Replicate(), use_local_output=True),
    })
    if tied:  # both plans shard the [V, H] weight along V: share the embedding's DTensor again
        head.weight = backbone.embed_tokens.weight
    for layer in layers:
        _check_llama_layer(layer)
        parallelize_module(layer, tp_mesh, _layer_plan(sequence_parallel))


def _layer_plan(sequence_parallel: bool) -> dict:
    """Per-decoder-layer plan; under sequence parallel the residual stream is a Shard(1) DTensor."""
    if not sequence_parallel:
        return {f"self_attn.{n}_proj": ColwiseParallel() for n in "qkv"} | {
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    gather = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                desired_input_kwarg_layouts={"hidden_states": Replicate()}, use_local_output=True)
    gather_mlp = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                    use_local_output=True)
    scatter = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    return {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
            "self_attn": gather, "mlp": gather_mlp,
            **{f"self_attn.{n}_proj": ColwiseParallel() for n in "qkv"}, "self_attn.o_proj": scatter,
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": scatter}


def _check_llama_layer(layer: nn.Module) -> None:
    names = {n for n, _ in layer.named_modules()}
    needed = {"input_layernorm", "post_attention_layernorm", "self_attn", "mlp",
              *(f"self_attn.{n}_proj" for n in "qkvo"), *(f"mlp.{n}_proj" for n in ("gate", "up", "down"))}
    if not needed <= names:
        raise ValueError(f"tensor parallel supports Llama-style decoder layers; {type(layer).__name__} lacks "
                         f"{sorted(needed - names)}: set dtensor_cfg.tensor_parallel_size 1 for this model")


def _path(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def offload_policy(cpu_offload: bool, device: torch.device) -> OffloadPolicy:
    """FSDP2's CPU offload: sharded parameters, gradients and optimizer state live in host memory
    and are copied to `device` for each use; the optimizer steps on the CPU. With a CPU device the
    shards already live in host memory, so the policy changes no placement (it still runs)."""
    if not cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


@dataclass(frozen=True)
class Materialization:
    """Where `to_empty` puts the sharded parameters of the meta-device model, and where its
    buffers (not managed by FSDP: rotary `inv_freq`) then live."""

    params: torch.device
    buffers: torch.device


def materialization(device: torch.device, cpu_offload: bool) -> Materialization:
    """With FSDP2's CPUOffloadPolicy the sharded parameters must be materialised on the CPU (its
    lazy init refuses others: `FSDPParamGroup._validate_cpu_offload_params`) while the buffers
    are used in the forward on `device` (torchtitan's trainer: init_device "cpu", buffer_device
    the accelerator). Without offload both live on `device`."""
    device = torch.device(device)
    return Materialization(torch.device("cpu") if cpu_offload else device, device)


@torch.no_grad()
def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the global L2 norm of the gradients to `max_norm`; returns the norm before clipping.

    Under FSDP x TP the gradients live on different meshes (2-D for TP weights, "dp" only for
    the rest), which torch's clip refuses to mix. Each mesh's group norm is reduced over its
    own mesh (a DTensor norm is Partial until `full_tensor`; grouped by placements too), and the group norms combine in
    plain tensors. Plain (non-DTensor) gradients are identical on every rank.
    """
    groups: dict[tuple | None, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            g = p.grad
            key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
            groups.setdefault(key, []).append(g)
    squares = []
    for grads in groups.values():
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2)
    total = torch.stack(squares).sum().sqrt() if squares else torch.zeros(())
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1 and math.isfinite(max_norm):
        for grads in groups.values():
            for g in grads:
                (g.to_local() if isinstance(g, DTensor) else g).mul_(coef)
    return total


def resolve_parallel_plan(dotted: str) -> dict:
    """`dtensor_cfg.custom_parallel_plan`: the dict at a dotted path (module path, then attribute),
    or the dict a function at that path returns (NeMo-RL's forms)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except AttributeError:
            break
        plan = target() if callable(target) else target
        if not isinstance(plan, dict) or not plan:
            raise ValueError(f"dtensor_cfg.custom_parallel_plan {dotted!r} is {type(plan).__name__}, not a non-empty "
                             "dict of module paths to ParallelStyles (or a function returning one)")
        return plan
    raise ValueError(f"dtensor_cfg.custom_parallel_plan {dotted!r} names nothing importable: give "
                     "'package.module.plan' (a dict, or a function returning one) on the trainer's PYTHONPATH")
