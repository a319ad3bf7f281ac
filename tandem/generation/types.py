"""Plain domain types of the generator: what callers send and get back (no protobuf here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]
MemoryKind = Literal["weights", "kv_cache"]
"""Device memory a sleeping generator releases (vLLM's sleep-mode tags), in wake-up order."""


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How to sample; shared by every prompt of a request.

    temperature 0 is greedy. top_p 1.0 and top_k -1 (or 0) disable those cutoffs. With a
    seed, sample j of prompt i uses seed + i * n + j, so no two samples share a stream;
    without one, samples are drawn from the engine's generator.
    """

    n: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or positive, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    def sample_seed(self, prompt_index: int, sample_index: int) -> int | None:
        """The seed of one (prompt, sample), or None when the request has no seed."""
        if self.seed is None:
            return None
        return self.seed + prompt_index * self.n + sample_index


@dataclass(frozen=True)
class Completion:
    """One finished completion.

    token_ids excludes the prompt. logprobs[k] is the untempered logprob (log_softmax of
    the raw logits) of token_ids[k] given the prompt and token_ids[:k]; one per token.
    weight_version is the version of the weights that sampled every token.
    routed_experts: MoE router replay, when the generator was started to return them: the
    experts the engine routed each fed position of prompt + completion to (every token but the
    last sampled one), flat and row-major [position, MoE layer, k]; empty otherwise.
    """

    prompt_index: int
    sample_index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    routed_experts: tuple[int, ...] = ()


@dataclass(frozen=True)
class GeneratorInfo:
    """What a generator serves right now."""

    model_name: str
    weight_version: int
    engine: str
    dtype: str
    max_num_seqs: int
    num_running: int
    sleeping: tuple[MemoryKind, ...] = ()
    """Memory released by a sleep and not woken yet (empty: awake)."""


@dataclass(frozen=True)
class ScoredSequence:
    """A sequence a teacher scores: prompt tokens (BOS included) then completion tokens."""

    token_ids: tuple[int, ...]
    prompt_length: int
    """Leading prompt tokens (>= 1); the tokens after them are scored."""

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_length < len(self.token_ids):
            raise ValueError(f"prompt_length must be in [1, {len(self.token_ids)}) (a prompt and at least one "
                             f"completion token), got {self.prompt_length}")


@dataclass(frozen=True)
class SequenceScores:
    """A teacher's scores of one ScoredSequence.

    logprobs[k] is the untempered logprob of token_ids[P + k] given token_ids[:P + k] (P the
    prompt length): one per completion token, aligned like Completion.logprobs. top[k], when
    asked for, holds position P + k's most likely (token id, logprob) pairs, most likely first.
    """

    logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...] = ()
