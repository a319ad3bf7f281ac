"""Next-token sampling for the generation the trainer serves itself (pure torch, no collectives).

Order of operations, as vLLM's sampler: temperature scales the raw logits, then top-k keeps the
k largest, then top-p keeps the smallest set of the most likely tokens whose probability mass
reaches top_p (the most likely token always stays). Temperature 0 is greedy (argmax of the
raw logits; top-k / top-p cannot change it). The logprob returned for a sampled token is
untempered: log_softmax of the raw logits, whatever temperature, top-k or top-p did
(the convention of `tandem.generation.engine`).

Each sample draws from its own `torch.Generator`, so a seeded sample gets the same tokens
however the rows are batched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def row_generator(seed: int | None, fallback: torch.Generator) -> torch.Generator:
    """The random stream of one sample: from its seed, else drawn from `fallback`."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=fallback))
    return torch.Generator().manual_seed(seed)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[R, V] logits with the tokens that top-k and then top-p drop set to -inf.

    top_k <= 0 or >= V and top_p >= 1 disable those cutoffs."""
    out = logits
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens more likely than this one
        drop = mass_before >= top_p  # the first token (mass_before 0) always stays
        out = out.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return out


def sample_tokens(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                  generators: Sequence[torch.Generator]) -> tuple[list[int], list[float]]:
    """One token per row of [R, V] raw logits (float32, CPU) and its untempered logprob.

    generators[r] is row r's stream; greedy rows draw nothing from it."""
    assert logits.dim() == 2 and len(generators) == logits.shape[0], "one generator per row"
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if temperature == 0:
        tokens = torch.argmax(logits, dim=-1)
    else:
        probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
        tokens = torch.stack([torch.multinomial(probs[r], 1, generator=g)[0] for r, g in enumerate(generators)])
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens.tolist(), chosen.tolist()
