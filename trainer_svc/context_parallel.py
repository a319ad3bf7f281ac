"""Context parallelism's data layout: each sequence split over the CP ranks, and token results
gathered back (no torch.distributed beyond the gather; used by the Megatron backend, whose
attention rings over the CP group through Transformer Engine).

Causal attention costs more for later tokens, so the sequence is cut into 2 x cp chunks and CP
rank r takes chunks r and 2cp-1-r (Megatron's load-balanced layout, the one its TE attention
expects). Widths must therefore be multiples of 2 x cp (`multiple`).

Per-token results (logprobs) are computed on the local tokens against labels split the same
way, then all-gathered into the full sequence on every CP rank. The gather is differentiable:
its backward sums, for each rank's slice, the gradients that every rank's loss sends it. Every
CP rank computes the same loss from the gathered tokens, so each slice receives cp times the
loss's gradient, and the data-parallel gradient sum then also runs over the CP ranks: a loss
is divided by cp (`loss_scale`) before backward to leave the gradient the full sequence's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def multiple(cp_size: int) -> int:
    """Widths must be multiples of this."""
    return 1 if cp_size == 1 else 2 * cp_size


def loss_scale(cp_size: int) -> float:
    return 1.0 / cp_size


def split(tensor: torch.Tensor, cp_size: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's chunks (r and 2cp-1-r) of `tensor` along `dim`."""
    if cp_size == 1:
        return tensor
    if tensor.shape[dim] % multiple(cp_size):
        raise ValueError(f"context parallel: width {tensor.shape[dim]} is not a multiple of 2 x {cp_size}")
    chunks = tensor.chunk(2 * cp_size, dim=dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]], dim=dim)


def unsplit(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full tensor from every rank's `split` result, in CP rank order."""
    cp_size = len(parts)
    if cp_size == 1:
        return parts[0]
    chunks: list[torch.Tensor | None] = [None] * (2 * cp_size)
    for rank, part in enumerate(parts):
        first, second = part.chunk(2, dim=dim)
        chunks[rank], chunks[2 * cp_size - 1 - rank] = first, second
    return torch.cat(chunks, dim=dim)


def gather(local: torch.Tensor, cp_size: int, group: dist.ProcessGroup | None, dim: int = 1) -> torch.Tensor:
    """The full tensor on every CP rank, differentiable (see the module doc)."""
    if cp_size == 1:
        return local
    from torch.distributed.nn.functional import all_gather

    return unsplit(list(all_gather(local.contiguous(), group=group)), dim=dim)


def labels(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The next token of every position (pad after the last): split with the inputs, so each CP
    rank scores its own positions without the tokens of another rank."""
    return torch.nn.functional.pad(input_ids[:, 1:], (0, 1), value=pad_id)
