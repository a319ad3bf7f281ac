"""Export of a mixture-of-experts model's weights: full HF tensors on rank 0 in `moe.py`'s
export order, as `weights.iter_hf_tensors` does for dense models.

Dense tensors (embeddings, attention, norms, router, shared expert) go as there: all-gathered
over the TP group by data-parallel rank 0's replica, converted and yielded by rank 0. Experts
live on their expert-parallel (EP) rank, split over the expert-tensor-parallel (ETP) ranks, and
are replicated over expert-data-parallel ranks: the ranks of expert-data-parallel rank 0
all-gather local expert j's linear over ETP, then over EP, which gives expert j of every EP rank
(the `expert_order`); rank 0 converts and yields them one by one. So rank 0 holds one
gathered linear of each EP rank at a time (`held` counts it). Pipeline parallel is refused for
MoE models (model.check_supported), so every exporting rank is in rank 0's stage.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from trainer_svc.backends.megatron import gpu_features, moe
from trainer_svc.backends.megatron.model import Layout, shard_of
from trainer_svc.held_bytes import HeldBytes


def iter_moe_hf_tensors(model: torch.nn.Module, arch: moe.MoeArch, layout: Layout, *, groups: dict[str, dist.ProcessGroup],
                        dense_exports: bool, rank: int, held: HeldBytes) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective generator (every rank must exhaust it): rank 0 yields every HF tensor, full and
    float32. `groups`: "tp", "ep", "etp" process groups of this rank; `dense_exports`: this rank's
    replica exports the dense tensors (data- and context-parallel rank 0)."""
    params = {gpu_features.local_name(n): p for n, p in model.named_parameters()}
    local = arch.moe.num_experts // layout.ep_size
    expert_exports = layout.edp_rank == 0
    gathered: dict[tuple[int, str], list[list[torch.Tensor]]] = {}
    for name in moe.megatron_names_in_order(arch, shard_of(arch, layout), layout.ep_size):
        if ".local_experts." in name:
            if not expert_exports:
                continue
            g, linear = int(name.split(".")[6]), name.split(".")[7]
            j, source = g % local, g // local
            if (j, linear) not in gathered:  # first of expert j's EP copies: one gather brings them all
                local_param = params[name.replace(f"local_experts.{g}.", f"local_experts.{j}.")]
                gathered[(j, linear)] = _gather_expert(local_param, layout, groups, held)
            shards = gathered[(j, linear)][source]
            if source == layout.ep_size - 1:
                del gathered[(j, linear)]
        else:
            if not dense_exports:
                continue
            shards = _all_gather(params[name], layout.tp_size, groups["tp"], held)
            if layout.tp_rank != 0:
                continue
        if rank != 0:
            continue
        outputs = [(hf_name, held.track(t)) for hf_name, t in moe.megatron_to_hf(name, shards, arch, 0)]
        del shards
        while outputs:
            yield outputs.pop(0)


def _gather_expert(param: torch.Tensor, layout: Layout, groups: dict[str, dist.ProcessGroup],
                   held: HeldBytes) -> list[list[torch.Tensor]]:
    """[EP rank][ETP rank] shards of local expert `param` from every EP rank."""
    etp_shards = _all_gather(param, layout.etp_size, groups["etp"], held)
    per_ep: list[list[torch.Tensor]] = [[] for _ in range(layout.ep_size)]
    for shard in etp_shards:
        for e, tensor in enumerate(_all_gather(shard, layout.ep_size, groups["ep"], held)):
            per_ep[e].append(tensor)
    return per_ep


def _all_gather(tensor: torch.Tensor, size: int, group: dist.ProcessGroup, held: HeldBytes) -> list[torch.Tensor]:
    local = tensor.detach().float().contiguous()
    if size == 1:
        return [local]
    out = [held.track(torch.empty_like(local)) for _ in range(size)]
    dist.all_gather(out, local, group=group)
    return out


def process_groups() -> dict[str, dist.ProcessGroup]:
    """This rank's TP, EP and ETP groups (Megatron's parallel state)."""
    from megatron.core import parallel_state as ps

    return {"tp": ps.get_tensor_model_parallel_group(), "ep": ps.get_expert_model_parallel_group(),
            "etp": ps.get_expert_tensor_parallel_group()}
