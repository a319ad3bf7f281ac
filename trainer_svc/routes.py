"""MoE router replay (R3): the experts a generator routed each token to, as the trainer's
router takes them. Pure tensor code (no Megatron import), unit-tested on its own.

A sample's `routed_experts` is flat and row-major [position, MoE layer, k]: row j holds, for
every MoE layer, the k experts position j of token_ids went to. A generator feeds every token
but the last sampled one, so a sample brings len(token_ids) - 1 rows; positions past the rows
given (that last token, a micro-batch's padding) are marked NOT_ROUTED and the trainer's own
router picks their experts. The last token's output is never scored (its logprob would be of a
token after the sample), so its experts change nothing the loss sees.

Megatron's router sees a micro-batch as [sequence, batch] flattened sequence-major (token
(t, b) is row t * B + b); with sequence parallelism each tensor-parallel rank holds a
contiguous 1/TP of the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NOT_ROUTED = -1
"""A position whose experts the generator did not give: the trainer's own router picks them."""


def num_route_rows(routed_experts: Sequence[int], num_layers: int, topk: int, num_tokens: int) -> int:
    """Rows in one sample's flat routes; ValueError when they cannot be the routes of that sample."""
    per_row = num_layers * topk
    if len(routed_experts) % per_row:
        raise ValueError(f"routed_experts holds {len(routed_experts)} values, not a multiple of MoE layers x top-k "
                         f"= {num_layers} x {topk}: the generator's model is not the trainer's")
    rows = len(routed_experts) // per_row
    if rows > num_tokens:
        raise ValueError(f"routed_experts has {rows} rows for a sample of {num_tokens} tokens (at most one per token)")
    return rows


def routes_BTLK(samples: Sequence, width: int, num_layers: int, topk: int, num_experts: int) -> torch.Tensor | None:
    """[B, width, layers, k] int64 expert indices of right-padded `samples` (objects with
    `token_ids` and `routed_experts`), NOT_ROUTED where not given; None when no sample has routes."""
    if not any(getattr(s, "routed_experts", None) for s in samples):
        return None
    out = torch.full((len(samples), width, num_layers, topk), NOT_ROUTED, dtype=torch.long)
    for b, sample in enumerate(samples):
        flat = sample.routed_experts
        if not flat:
            continue
        rows = num_route_rows(flat, num_layers, topk, len(sample.token_ids))
        given = torch.tensor(list(flat), dtype=torch.long).view(rows, num_layers, topk)
        if int(given.min()) < 0 or int(given.max()) >= num_experts:
            raise ValueError(f"routed_experts names expert {int(given.min()) if int(given.min()) < 0 else int(given.max())}"
                             f"; the model has experts 0..{num_experts - 1}")
        out[b, :rows] = given
    return out


def router_targets(routes_BTLK: torch.Tensor, *, tp_rank: int = 0, tp_size: int = 1,
                   sequence_parallel: bool = False) -> list[torch.Tensor]:
    """One [tokens, k] tensor per MoE layer in the order Megatron's router flattens its input
    ([T, B] sequence-major; with sequence parallelism this TP rank's contiguous T / TP rows)."""
    B, T, L, K = routes_BTLK.shape
    routes_TBLK = routes_BTLK.transpose(0, 1)
    if sequence_parallel and tp_size > 1:
        if T % tp_size:
            raise ValueError(f"sequence parallel needs the width ({T}) to be a multiple of TP={tp_size}")
        share = T // tp_size
        routes_TBLK = routes_TBLK[tp_rank * share:(tp_rank + 1) * share]
    return [routes_TBLK[:, :, layer].reshape(-1, K).contiguous() for layer in range(L)]
