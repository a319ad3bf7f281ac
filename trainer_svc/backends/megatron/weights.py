"""Weights in and out of the Megatron model: load through the conversion cache, and export
full HF-named tensors to rank 0 one at a time in the bucket plan's order (TP shards
all-gathered per tensor, later pipeline stages sent to rank 0 tensor by tensor), so rank 0
never holds more than one gathered tensor and no rank buffers its stage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer_svc.backends.megatron import cache, gpu_features, moe
from trainer_svc.backends.megatron.convert import (
    Arch,
    hf_to_megatron,
    megatron_names_in_order,
    megatron_to_hf,
    read_hf_tensors,
)
from trainer_svc.backends.megatron.model import Layout, shard_of
from trainer_svc.held_bytes import HeldBytes


def load_weights(model: torch.nn.Module, arch: Arch, layout: Layout, model_dir: str, *, rank: int,
                 group: dist.ProcessGroup, log: Any) -> tuple[str, float]:
    """Fill `model` (this rank's stage) from the cache, converting first if needed.

    Collective. Returns ("cached", load seconds) when the entry existed, ("converted",
    convert + save seconds) when this call made it.
    """
    from megatron.core import dist_checkpointing

    root = cache.cache_dir()
    cache.check_shared(root, rank, group)
    entry = root / cache.entry_name(model_dir, arch.family, arch.padded_vocab(layout.tp_size))
    if cache.is_complete(entry):
        start = time.perf_counter()
        state = dist_checkpointing.load(model.sharded_state_dict(), str(entry))
        model.load_state_dict(state)
        seconds = time.perf_counter() - start
        log.info("megatron_checkpoint_cache_hit", entry=str(entry), seconds=round(seconds, 3))
        return "cached", seconds
    start = time.perf_counter()
    get, shard = read_hf_tensors(model_dir), shard_of(arch, layout)
    converted = (moe.hf_to_megatron(get, arch, shard, layout.experts) if moe.is_moe(arch)
                 else hf_to_megatron(get, arch, shard))
    _assign(model, converted)
    convert_s = time.perf_counter() - start
    tmp = cache.temporary_entry(entry, rank, group)
    dist_checkpointing.save(model.sharded_state_dict(), str(tmp))
    cache.publish_entry(tmp, entry, {"source": str(Path(model_dir).resolve()), "family": arch.family,
                                     "padded_vocab": arch.padded_vocab(layout.tp_size),
                                     "format": cache.FORMAT_VERSION}, rank, group)
    total_s = time.perf_counter() - start
    log.info("megatron_checkpoint_converted", entry=str(entry), convert_s=round(convert_s, 3), total_s=round(total_s, 3))
    return "converted", total_s


def _assign(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    params = {gpu_features.local_name(n): p for n, p in model.named_parameters()}  # TE spec: see gpu_features
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise KeyError(f"the converter produced no value for {missing}")
    with torch.no_grad():
        for name, value in tensors.items():
            if name not in params:
                continue  # e.g. the output layer of a tied model at PP=1 (it is the embedding)
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(f"{name}: converted shape {tuple(value.shape)} != model shape {tuple(params[name].shape)}")
            params[name].copy_(value)


def _stage_params(arch: Arch, layout: Layout, pp_rank: int) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of what stage `pp_rank` exports, in its order (known to every rank)."""
    from trainer_svc.backends.megatron.convert import hf_shapes

    shard = shard_of(arch, Layout(0, layout.tp_size, pp_rank, layout.pp_size, 0, layout.dp_size))
    shapes = hf_shapes(arch)
    names = []
    if shard.pre_process:
        names.append("model.embed_tokens.weight")
    for i in range(shard.first_layer, shard.first_layer + shard.num_layers):
        names += [n for n in shapes if n.startswith(f"model.layers.{i}.")]
    if shard.post_process:
        names.append("model.norm.weight")
        if not arch.tie_word_embeddings:
            names.append("lm_head.weight")
    return [(n, shapes[n]) for n in names]


def iter_hf_tensors(model: torch.nn.Module, arch: Arch, layout: Layout, *, tp_group: dist.ProcessGroup,
                    stage_ranks: list[int], exports: bool, rank: int,
                    held: HeldBytes) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective generator: on global rank 0 yields every HF tensor (full, float32, on the
    model's device) in `hf_names_in_order` order, the bucket plan's; the other ranks yield
    nothing but must exhaust it (they take part in the gathers and sends).

    Stage by stage, tensor by tensor: each exporting rank all-gathers one Megatron tensor over
    its TP group; on stage 0 rank 0 converts and yields it, on a later stage the first TP rank
    converts it and sends the HF tensors straight to rank 0, which yields them when it reaches
    that stage. So rank 0 holds one gathered tensor at a time (`held` counts it) and no rank
    buffers its stage. `exports`: this rank's replica takes part (data- and context-parallel
    rank 0; the others hold copies). `stage_ranks[s]`: the global rank that sends stage s (rank
    0's pipeline group), known on rank 0.
    """
    if not exports:
        return
    params = {gpu_features.local_name(n): p for n, p in model.named_parameters()}
    shard = shard_of(arch, layout)
    for name in megatron_names_in_order(arch, shard):
        shards = _gather(params[name], layout.tp_size, tp_group, held)
        if layout.tp_rank != 0:
            del shards
            continue
        outputs = [(hf_name, held.track(t)) for hf_name, t in megatron_to_hf(name, shards, arch, shard.first_layer)]
        del shards
        while outputs:
            hf_name, tensor = outputs.pop(0)
            if rank == 0:
                yield hf_name, tensor
            else:
                dist.send(tensor.contiguous(), dst=0)
            del tensor  # freed before the next tensor is gathered
    if rank != 0:
        return
    device = next(iter(params.values())).device
    for stage in range(1, layout.pp_size):
        for hf_name, shape in _stage_params(arch, layout, stage):
            buffer = held.track(torch.empty(shape, dtype=torch.float32, device=device))
            dist.recv(buffer, src=stage_ranks[stage])
            yield hf_name, buffer
            del buffer


def _gather(param: torch.Tensor, tp_size: int, tp_group: dist.ProcessGroup, held: HeldBytes) -> list[torch.Tensor]:
    """The parameter's shards from every TP rank, in TP order (float32)."""
    local = param.detach().float().contiguous()
    shards = [held.track(torch.empty_like(local)) for _ in range(tp_size)]
    dist.all_gather(shards, local, group=tp_group)
    return shards
