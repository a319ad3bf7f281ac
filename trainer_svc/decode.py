"""Autoregressive decoding over all trainer ranks: the generation the trainer serves from its
own model (policy.generation.backend: megatron).

One request runs as one lockstep command, so every rank takes part in every forward (tensor
and pipeline parallel need them all) and generation never interleaves with a train step.
Each step, every rank runs the unfinished rows through the model; rank 0 gets the next-token
logits, samples (`trainer_svc.sampling`) and broadcasts the tokens, with an abort flag, over
the gloo group; every rank then appends the same tokens, so all agree on which rows are
finished (an EOS token: "stop"; max_tokens reached: "length"). Rank 0 hands each finished
completion to the sink at once, so completions stream as they finish.

No KV cache: every step runs each unfinished row's whole prefix through the forward-only
path, O(length^2) work per completion. That is fine for the short completions of small
models and far from an inference engine's speed. Rows are decoded max_num_seqs at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from tandem.generation.types import Completion, FinishReason, SamplingConfig
from trainer_svc.sampling import row_generator, sample_tokens


@dataclass(frozen=True)
class DecodeRequest:
    """What every rank needs to decode one generate call (pickled to them by the lockstep)."""

    prompts: tuple[tuple[int, ...], ...]
    sampling: SamplingConfig
    weight_version: int


@dataclass(frozen=True)
class DecodeSink:
    """Rank 0's side of a call: where finished completions go, and whether the caller left."""

    emit: Callable[[Completion], None]
    aborted: Callable[[], bool]


class NextTokenLogits(Protocol):
    def last_token_logits(self, rows: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """Collective: [len(rows), vocab] float32 logits of the token after each row on rank 0, else None."""
        ...


class Decoder:
    """Decodes requests on every rank; only rank 0 samples (and owns the random streams)."""

    def __init__(self, model: NextTokenLogits, *, eos_ids: frozenset[int], max_num_seqs: int,
                 group: dist.ProcessGroup | None, rank: int, seed: int):
        self._model = model
        self._eos_ids = eos_ids
        self._max_num_seqs = max_num_seqs
        self._group = group
        self._rank = rank
        self._fallback = torch.Generator().manual_seed(seed)  # streams of unseeded samples

    def run(self, request: DecodeRequest, sink: DecodeSink | None) -> bool:
        """Every rank (sink on rank 0 only); False if the caller aborted before the end."""
        n = request.sampling.n
        rows = [(i, j) for i in range(len(request.prompts)) for j in range(n)]
        for start in range(0, len(rows), self._max_num_seqs):
            if not self._decode(request, rows[start:start + self._max_num_seqs], sink):
                return False
        return True

    def _decode(self, request: DecodeRequest, rows: list[tuple[int, int]], sink: DecodeSink | None) -> bool:
        s = request.sampling
        seqs = [list(request.prompts[i]) for i, _ in rows]
        generated: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        streams = [row_generator(s.sample_seed(i, j), self._fallback) for i, j in rows] if self._rank == 0 else []
        active = list(range(len(rows)))
        while active:
            logits = self._model.last_token_logits([seqs[r] for r in active])
            message = torch.zeros(1 + len(active), dtype=torch.long)  # [stop flag, token of each active row]
            error = None
            if self._rank == 0:
                assert logits is not None and sink is not None, "rank 0 samples"
                try:
                    tokens, token_logprobs = sample_tokens(logits.cpu(), s.temperature, s.top_k, s.top_p,
                                                           [streams[r] for r in active])
                    message[1:] = torch.tensor(tokens, dtype=torch.long)
                    message[0] = int(sink.aborted())
                except Exception as exc:  # stop the other ranks too, or they would wait in the next forward
                    error, message[0] = exc, 1
            dist.broadcast(message, src=0, group=self._group)
            if error is not None:
                raise error
            if message[0]:
                return False
            still = []
            for k, r in enumerate(active):
                token = int(message[1 + k])
                seqs[r].append(token)
                generated[r].append(token)
                if self._rank == 0:
                    logprobs[r].append(token_logprobs[k])
                reason: FinishReason | None = ("stop" if token in self._eos_ids
                                               else "length" if len(generated[r]) >= s.max_tokens else None)
                if reason is None:
                    still.append(r)
                elif sink is not None:
                    sink.emit(Completion(rows[r][0], rows[r][1], tuple(generated[r]), tuple(logprobs[r]), reason,
                                         request.weight_version))
            active = still
        return True
