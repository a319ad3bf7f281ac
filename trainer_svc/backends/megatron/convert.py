"""The project's HF <-> Megatron converter for the Llama, Mistral and Qwen2 families
(Megatron-core's local layer spec GPTModel), at any TP and PP layout. Mistral without a sliding
window is the Llama layout under another name (its tensors are named and shaped alike).

Layout facts (megatron-core local spec):
- `linear_qkv` interleaves the heads per query group: for each of the `num_kv_heads` groups,
  that group's query heads, then its key head, then its value head (weight and, for Qwen2,
  bias). TP splits the groups, so each rank's shard is a contiguous block.
- `linear_fc1` is `[gate; up]` per TP rank: gate and up are split separately, then stacked.
- Column-parallel tensors (qkv, fc1, word embeddings, output layer) split on dim 0;
  row-parallel ones (`linear_proj`, `linear_fc2`) on dim 1; norms are replicated.
- The vocabulary is padded to a multiple of TP (`padded_vocab`); padded rows are zero and
  cut off again on export. Layer i of pipeline stage s is global layer `offset(s) + i`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from trainer_svc.config.arch import SUPPORTED_FAMILIES, Arch  # noqa: F401 (re-exported for the backend)


@dataclass(frozen=True)
class Shard:
    """Where one rank sits: TP rank/size and the global layers of its pipeline stage."""

    tp_rank: int
    tp_size: int
    first_layer: int
    num_layers: int
    pre_process: bool
    post_process: bool
    padded_vocab: int


def _layer_names(i: int) -> dict[str, str]:
    hf, mg = f"model.layers.{i}.", "decoder.layers.{}."
    return {"input_layernorm": hf + "input_layernorm.weight", "pre_mlp_layernorm": hf + "post_attention_layernorm.weight",
            "proj": hf + "self_attn.o_proj.weight", "fc2": hf + "mlp.down_proj.weight",
            "q": hf + "self_attn.q_proj.", "k": hf + "self_attn.k_proj.", "v": hf + "self_attn.v_proj.",
            "gate": hf + "mlp.gate_proj.weight", "up": hf + "mlp.up_proj.weight", "mg": mg}


def _interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Arch) -> torch.Tensor:
    groups, per_group = arch.num_kv_heads, arch.num_heads // arch.num_kv_heads
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * arch.head_dim, *rest)
    k = k.reshape(groups, arch.head_dim, *rest)
    v = v.reshape(groups, arch.head_dim, *rest)
    return torch.cat([q, k, v], dim=1)  # [groups, (per_group + 2) * head_dim, ...]


def _split_qkv(qkv: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, per_group, d = arch.num_kv_heads, arch.num_heads // arch.num_kv_heads, arch.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_vocab(weight: torch.Tensor, padded: int) -> torch.Tensor:
    if weight.shape[0] == padded:
        return weight
    return torch.cat([weight, weight.new_zeros(padded - weight.shape[0], *weight.shape[1:])])


def attention_layer(get: Callable[[str], torch.Tensor], names: dict[str, str], mg: str, arch: Arch,
                    shard: Shard) -> dict[str, torch.Tensor]:
    """One layer's norms and attention (this TP rank's shards) under the Megatron prefix `mg`;
    dense and MoE layers share them (moe.py)."""
    r, tp = shard.tp_rank, shard.tp_size
    out = {mg + "input_layernorm.weight": get(names["input_layernorm"]).clone(),
           mg + "pre_mlp_layernorm.weight": get(names["pre_mlp_layernorm"]).clone()}
    qkv = _interleave_qkv(get(names["q"] + "weight"), get(names["k"] + "weight"), get(names["v"] + "weight"), arch)
    out[mg + "self_attention.linear_qkv.weight"] = qkv.chunk(tp, dim=0)[r].reshape(-1, arch.hidden_size).clone()
    if arch.qkv_bias:
        bias = _interleave_qkv(get(names["q"] + "bias"), get(names["k"] + "bias"), get(names["v"] + "bias"), arch)
        out[mg + "self_attention.linear_qkv.bias"] = bias.chunk(tp, dim=0)[r].reshape(-1).clone()
    out[mg + "self_attention.linear_proj.weight"] = get(names["proj"]).chunk(tp, dim=1)[r].clone()
    return out


def hf_to_megatron(get: Callable[[str], torch.Tensor], arch: Arch, shard: Shard) -> dict[str, torch.Tensor]:
    """This rank's Megatron tensors (local-spec GPTModel names) from the HF tensors `get(name)`."""
    r, tp = shard.tp_rank, shard.tp_size
    out: dict[str, torch.Tensor] = {}

    def col(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, dim=0)[r].clone()

    def row(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, dim=1)[r].clone()

    if shard.pre_process:
        out["embedding.word_embeddings.weight"] = col(_pad_vocab(get("model.embed_tokens.weight"), shard.padded_vocab))
    for local in range(shard.num_layers):
        n = _layer_names(shard.first_layer + local)
        mg = n["mg"].format(local)
        out.update(attention_layer(get, n, mg, arch, shard))
        out[mg + "mlp.linear_fc1.weight"] = torch.cat([col(get(n["gate"])), col(get(n["up"]))])
        out[mg + "mlp.linear_fc2.weight"] = row(get(n["fc2"]))
    if shard.post_process:
        out["decoder.final_layernorm.weight"] = get("model.norm.weight").clone()
        head = "model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"
        out["output_layer.weight"] = col(_pad_vocab(get(head), shard.padded_vocab))
    return out


def megatron_to_hf(name: str, tp_shards: list[torch.Tensor], arch: Arch, first_layer: int) -> Iterator[tuple[str, torch.Tensor]]:
    """HF tensors of one Megatron tensor, given its shards from every TP rank (in TP order).

    `name` is the local-spec name on a stage whose first global layer is `first_layer`. The
    output layer of a tied model yields nothing (HF keeps only the embedding).
    """
    if name == "embedding.word_embeddings.weight":
        yield "model.embed_tokens.weight", torch.cat(tp_shards)[:arch.vocab_size]
        return
    if name == "output_layer.weight":
        if not arch.tie_word_embeddings:
            yield "lm_head.weight", torch.cat(tp_shards)[:arch.vocab_size]
        return
    if name == "decoder.final_layernorm.weight":
        yield "model.norm.weight", tp_shards[0]
        return
    parts = name.split(".")
    if parts[:2] != ["decoder", "layers"]:
        raise KeyError(f"no HF name for Megatron tensor {name!r}")
    n = _layer_names(first_layer + int(parts[2]))
    tail = ".".join(parts[3:])
    if tail in ("input_layernorm.weight", "pre_mlp_layernorm.weight"):
        yield n[tail.split(".")[0]], tp_shards[0]
    elif tail in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = tail.rsplit(".", 1)[1]
        for prefix, tensor in zip(("q", "k", "v"), _split_qkv(torch.cat(tp_shards), arch)):
            yield n[prefix] + kind, tensor
    elif tail == "self_attention.linear_proj.weight":
        yield n["proj"], torch.cat(tp_shards, dim=1)
    elif tail == "mlp.linear_fc1.weight":
        halves = [s.chunk(2, dim=0) for s in tp_shards]
        yield n["gate"], torch.cat([h[0] for h in halves])
        yield n["up"], torch.cat([h[1] for h in halves])
    elif tail == "mlp.linear_fc2.weight":
        yield n["fc2"], torch.cat(tp_shards, dim=1)
    else:
        raise KeyError(f"no HF name for Megatron tensor {name!r}")


def megatron_names_in_order(arch: Arch, shard: Shard) -> list[str]:
    """The stage's Megatron tensors in export order: `megatron_to_hf` over them, stage after
    stage, yields exactly `hf_names_in_order` (the bucket plan's order)."""
    names = ["embedding.word_embeddings.weight"] if shard.pre_process else []
    for local in range(shard.num_layers):
        mg = f"decoder.layers.{local}."
        names += [mg + "input_layernorm.weight", mg + "pre_mlp_layernorm.weight", mg + "self_attention.linear_qkv.weight"]
        if arch.qkv_bias:
            names.append(mg + "self_attention.linear_qkv.bias")
        names += [mg + "self_attention.linear_proj.weight", mg + "mlp.linear_fc1.weight", mg + "mlp.linear_fc2.weight"]
    if shard.post_process:
        names.append("decoder.final_layernorm.weight")
        if not arch.tie_word_embeddings:  # a tied output layer exports nothing (HF keeps the embedding)
            names.append("output_layer.weight")
    return names


def hf_names_in_order(arch: Arch) -> list[str]:
    """HF tensor names in the order export yields them (stage by stage, layer by layer)."""
    names = ["model.embed_tokens.weight"]
    for i in range(arch.num_layers):
        n = _layer_names(i)
        names += [n["input_layernorm"], n["pre_mlp_layernorm"], n["q"] + "weight", n["k"] + "weight", n["v"] + "weight"]
        if arch.qkv_bias:
            names += [n["q"] + "bias", n["k"] + "bias", n["v"] + "bias"]
        names += [n["proj"], n["gate"], n["up"], n["fc2"]]
    names.append("model.norm.weight")
    if not arch.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def read_hf_tensors(model_dir: str) -> Callable[[str], torch.Tensor]:
    """A getter over the checkpoint's safetensors files (tensors read lazily, as float32)."""
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no .safetensors files: the Megatron converter reads safetensors only")
    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {key: h for h in handles for key in h.keys()}

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise KeyError(f"tensor {name!r} is not in the checkpoint {model_dir}")
        return where[name].get_tensor(name).float()

    return get


def hf_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """HF names and full shapes, in export order (tied duplicates left out)."""
    h, d = arch.hidden_size, arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for name in hf_names_in_order(arch):
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            shapes[name] = (arch.vocab_size, h)
        elif name.endswith("layernorm.weight") or name == "model.norm.weight":
            shapes[name] = (h,)
        elif ".q_proj." in name:
            shapes[name] = (arch.num_heads * d, h) if name.endswith("weight") else (arch.num_heads * d,)
        elif ".k_proj." in name or ".v_proj." in name:
            shapes[name] = (arch.num_kv_heads * d, h) if name.endswith("weight") else (arch.num_kv_heads * d,)
        elif name.endswith("o_proj.weight"):
            shapes[name] = (h, arch.num_heads * d)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            shapes[name] = (arch.ffn_hidden_size, h)
        else:  # down_proj
            shapes[name] = (h, arch.ffn_hidden_size)
    return shapes
