"""HF <-> Megatron conversion of mixture-of-experts families (Qwen2-MoE, Mixtral) for the local
layer spec's MoE layer (router, SequentialMLP experts, Qwen2-MoE's gated shared expert), at any
tensor x expert parallel layout. Kept apart from the dense converter (convert.py), which it
calls for everything outside the MLP: embeddings, norms, attention and the output layer.

Layout facts (megatron-core local spec, MoE layer):
- `mlp.router.weight` [E, H] is replicated; HF's `gate.weight`.
- Expert g lives on expert-parallel rank g // (E / EP) as `mlp.experts.local_experts.{g % (E/EP)}`;
  its `linear_fc1` is `[gate; up]`, split over the expert-tensor-parallel (ETP) ranks like a
  dense fc1 (gate and up split separately, then stacked), `linear_fc2` split on dim 1.
- Qwen2-MoE's shared expert is `mlp.shared_experts.linear_fc1/fc2` (split over TP like a dense
  MLP) and `mlp.shared_experts.gate_weight` [1, H] (replicated): output * sigmoid(x @ gate^T).
- Routing: Qwen2-MoE with norm_topk_prob=false takes the softmax over all experts, then the top
  k (Megatron's `moe_router_pre_softmax`); Mixtral and norm_topk_prob=true renormalise over the
  top k, which is Megatron's top-k-then-softmax.
- Export order: every layer's experts go in `expert_order` (local index major, EP rank minor),
  the order in which one all-gather over the EP group produces them (`moe_weights.py`); names
  in this module's Megatron form carry the GLOBAL expert index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from trainer_svc.backends.megatron import convert
from trainer_svc.backends.megatron.convert import Arch, Shard, _layer_names
from trainer_svc.config import MOE_MODEL_TYPES

MOE_FAMILIES = MOE_MODEL_TYPES
_DENSE_MLP_TAILS = ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight")
_MIXTRAL_PARTS = {"gate": "w1", "up": "w3", "down": "w2"}


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    topk: int
    expert_ffn: int
    shared_ffn: int
    """0: no shared expert (Mixtral)."""
    pre_softmax: bool
    aux_loss_coeff: float


@dataclass(frozen=True)
class MoeArch(Arch):
    """A dense Arch (attention, norms, vocabulary) plus the MoE layer's shape."""

    moe: MoeSpec | None = None


@dataclass(frozen=True)
class ExpertShard:
    """Where one rank sits among the experts."""

    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1


class _DenseView:
    """The HF config as the dense converter reads it: model type `as_type`, MLP width `ffn`."""

    def __init__(self, config, as_type: str, ffn: int):
        self._config, self.model_type, self.intermediate_size = config, as_type, ffn

    def __getattr__(self, name):
        return getattr(self._config, name)


def arch_from_hf_config(config) -> Arch:
    """MoeArch for the MoE families, else the dense converter's Arch (its own checks)."""
    family = getattr(config, "model_type", "")
    if family not in MOE_FAMILIES:
        return Arch.from_hf_config(config)
    if family == "qwen2_moe":
        if config.decoder_sparse_step != 1 or config.mlp_only_layers:
            raise ValueError("Qwen2-MoE checkpoints with dense layers (decoder_sparse_step != 1 or mlp_only_layers) "
                             "are not supported by the Megatron converter: every layer must be a MoE layer")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("use_sliding_window: true is not supported by the Megatron converter")
        spec = MoeSpec(config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                       config.shared_expert_intermediate_size or 0, not config.norm_topk_prob,
                       float(config.router_aux_loss_coef))
        dense = Arch.from_hf_config(_DenseView(config, "qwen2", config.intermediate_size))
        dense = dataclasses.replace(dense, qkv_bias=bool(getattr(config, "qkv_bias", True)))
    else:
        if getattr(config, "sliding_window", None) and config.sliding_window < config.max_position_embeddings:
            raise ValueError("a Mixtral sliding_window shorter than max_position_embeddings is not supported by the "
                             "Megatron converter")
        if getattr(config, "router_jitter_noise", 0.0):
            raise ValueError("router_jitter_noise > 0 is not supported by the Megatron converter")
        spec = MoeSpec(config.num_local_experts, config.num_experts_per_tok, config.intermediate_size, 0, False,
                       float(config.router_aux_loss_coef))
        dense = Arch.from_hf_config(_DenseView(config, "llama", config.intermediate_size))
    fields = {f.name: getattr(dense, f.name) for f in dataclasses.fields(dense)}
    return MoeArch(**{**fields, "family": family}, moe=spec)


def is_moe(arch: Arch) -> bool:
    return isinstance(arch, MoeArch) and arch.moe is not None


def expert_order(arch: MoeArch, ep_size: int) -> list[int]:
    """Global expert indices in export order: local index major, EP rank minor."""
    local = arch.moe.num_experts // ep_size
    return [e * local + j for j in range(local) for e in range(ep_size)]


def _hf_moe_names(arch: MoeArch, layer: int) -> dict[str, Callable[..., str] | str]:
    base = f"model.layers.{layer}."
    if arch.family == "mixtral":
        moe = base + "block_sparse_moe."
        return {"router": moe + "gate.weight",
                "expert": lambda g, part: moe + f"experts.{g}.{_MIXTRAL_PARTS[part]}.weight"}
    return {"router": base + "mlp.gate.weight",
            "expert": lambda g, part: base + f"mlp.experts.{g}.{part}_proj.weight",
            "shared": lambda part: base + f"mlp.shared_expert.{part}_proj.weight",
            "shared_gate": base + "mlp.shared_expert_gate.weight"}


def _layer_moe_names(arch: MoeArch, local: int, layer: int, ep_size: int) -> tuple[list[str], list[str]]:
    """(Megatron names with global expert indices, HF names) of the MLP of global layer `layer`
    (the stage's layer `local`), in export order."""
    hf = _hf_moe_names(arch, layer)
    mg = f"decoder.layers.{local}.mlp."
    mg_names, hf_names = [mg + "router.weight"], [hf["router"]]
    for g in expert_order(arch, ep_size):
        mg_names += [mg + f"experts.local_experts.{g}.linear_fc1.weight", mg + f"experts.local_experts.{g}.linear_fc2.weight"]
        hf_names += [hf["expert"](g, "gate"), hf["expert"](g, "up"), hf["expert"](g, "down")]
    if arch.moe.shared_ffn:
        mg_names += [mg + "shared_experts.linear_fc1.weight", mg + "shared_experts.linear_fc2.weight",
                     mg + "shared_experts.gate_weight"]
        hf_names += [hf["shared"]("gate"), hf["shared"]("up"), hf["shared"]("down"), hf["shared_gate"]]
    return mg_names, hf_names


def hf_to_megatron(get: Callable[[str], torch.Tensor], arch: MoeArch, shard: Shard,
                   experts: ExpertShard) -> dict[str, torch.Tensor]:
    """This rank's Megatron tensors from the HF tensors `get(name)` (dense parts: convert.py)."""
    ends = dataclasses.replace(shard, num_layers=0)  # embedding, final norm, output layer
    out = convert.hf_to_megatron(get, arch, ends)
    r, tp = shard.tp_rank, shard.tp_size
    local_experts = arch.moe.num_experts // experts.ep_size
    for local in range(shard.num_layers):
        layer = shard.first_layer + local
        n, mg = _layer_names(layer), f"decoder.layers.{local}."
        out.update(convert.attention_layer(get, n, mg, arch, shard))
        hf = _hf_moe_names(arch, layer)
        out[mg + "mlp.router.weight"] = get(hf["router"]).clone()
        for j in range(local_experts):
            g, e = experts.ep_rank * local_experts + j, f"{mg}mlp.experts.local_experts.{j}."
            out[e + "linear_fc1.weight"] = _fc1(get(hf["expert"](g, "gate")), get(hf["expert"](g, "up")),
                                                experts.etp_rank, experts.etp_size)
            out[e + "linear_fc2.weight"] = get(hf["expert"](g, "down")).chunk(experts.etp_size, dim=1)[experts.etp_rank].clone()
        if arch.moe.shared_ffn:
            s = mg + "mlp.shared_experts."
            out[s + "linear_fc1.weight"] = _fc1(get(hf["shared"]("gate")), get(hf["shared"]("up")), r, tp)
            out[s + "linear_fc2.weight"] = get(hf["shared"]("down")).chunk(tp, dim=1)[r].clone()
            out[s + "gate_weight"] = get(hf["shared_gate"]).clone()
    return out


def _fc1(gate: torch.Tensor, up: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]]).clone()


def megatron_to_hf(name: str, shards: list[torch.Tensor], arch: MoeArch,
                   first_layer: int) -> Iterator[tuple[str, torch.Tensor]]:
    """HF tensors of one Megatron tensor (MLP names with the global expert index), given its
    shards from every TP rank (ETP ranks for experts) in order; other names go to convert.py."""
    parts = name.split(".")
    if parts[:2] != ["decoder", "layers"] or parts[3] != "mlp":
        yield from convert.megatron_to_hf(name, shards, arch, first_layer)
        return
    hf, tail = _hf_moe_names(arch, first_layer + int(parts[2])), ".".join(parts[4:])
    if tail == "router.weight":
        yield hf["router"], shards[0]
    elif tail.startswith("experts.local_experts."):
        g = int(parts[6])
        yield from _mlp_to_hf(parts[7], shards, lambda part: hf["expert"](g, part))
    elif tail == "shared_experts.gate_weight":
        yield hf["shared_gate"], shards[0]
    elif tail.startswith("shared_experts."):
        yield from _mlp_to_hf(parts[5], shards, hf["shared"])
    else:
        raise KeyError(f"no HF name for Megatron tensor {name!r}")


def _mlp_to_hf(linear: str, shards: list[torch.Tensor], name: Callable[[str], str]) -> Iterator[tuple[str, torch.Tensor]]:
    if linear == "linear_fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        yield name("gate"), torch.cat([h[0] for h in halves])
        yield name("up"), torch.cat([h[1] for h in halves])
    else:
        yield name("down"), torch.cat(shards, dim=1)


def megatron_names_in_order(arch: MoeArch, shard: Shard, ep_size: int) -> list[str]:
    """The stage's Megatron tensors in export order (convert.py's, with each layer's dense MLP
    replaced by the MoE layer's tensors)."""
    out: list[str] = []
    for name in convert.megatron_names_in_order(arch, shard):
        if name.endswith(_DENSE_MLP_TAILS[0]):
            local = int(name.split(".")[2])
            out += _layer_moe_names(arch, local, shard.first_layer + local, ep_size)[0]
        elif not name.endswith(_DENSE_MLP_TAILS[1]):
            out.append(name)
    return out


def hf_names_in_order(arch: MoeArch, ep_size: int) -> list[str]:
    """HF names in export order: convert.py's, each layer's gate/up/down replaced by the MoE layer's."""
    out: list[str] = []
    for name in convert.hf_names_in_order(arch):
        if name.endswith(".mlp.gate_proj.weight"):
            layer = int(name.split(".")[2])
            out += _layer_moe_names(arch, layer, layer, ep_size)[1]
        elif not name.endswith((".mlp.up_proj.weight", ".mlp.down_proj.weight")):
            out.append(name)
    return out


def hf_shapes(arch: MoeArch, ep_size: int = 1) -> dict[str, tuple[int, ...]]:
    """HF names and full shapes in export order."""
    dense, h, m = convert.hf_shapes(arch), arch.hidden_size, arch.moe
    shapes: dict[str, tuple[int, ...]] = {}
    for name in hf_names_in_order(arch, ep_size):
        if name in dense and ".mlp." not in name:
            shapes[name] = dense[name]
        elif name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            shapes[name] = (m.num_experts, h)
        elif name.endswith("shared_expert_gate.weight"):
            shapes[name] = (1, h)
        else:
            width = m.shared_ffn if ".shared_expert." in name else m.expert_ffn
            shapes[name] = (h, width) if name.endswith(("down_proj.weight", "w2.weight")) else (width, h)
    return shapes
