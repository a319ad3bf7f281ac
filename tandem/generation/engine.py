"""The contract of a generation engine, whatever runs it (vLLM in generator_svc; the trainer's
own Megatron model in `trainer_svc.generation`), served by `tandem.generation.servicer`.

Conventions every engine keeps:
- Prompts are lists of token ids, BOS included (the caller tokenizes; the engine adds nothing).
- A completion's token_ids exclude the prompt; logprobs has exactly one entry per completion
  token: logprobs[k] is the untempered log-probability (log_softmax of the raw logits, before
  temperature, top-p or top-k) of token_ids[k] given the prompt and token_ids[:k].
- Completions stream back one by one as each finishes, in no particular order; each carries
  its (prompt_index, sample_index) and the weight version that sampled all of its tokens.
- Weight versions start at 0 (the loaded checkpoint) and only change in load_weights
  (for the trainer's own engine: in the trainer's publish, which it runs between calls),
  which swaps atomically: generate calls running when the new weights are ready finish on
  the old ones, calls arriving meanwhile wait and run on the new ones, so every call (and
  every prompt's group of samples) is sampled by a single version.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from tandem.generation.types import (
    Completion,
    GeneratorInfo,
    MemoryKind,
    SamplingConfig,
    ScoredSequence,
    SequenceScores,
)
from tandem.weight_source import WeightSource


class GenerationEngine(Protocol):
    """One inference engine serving completions and receiving weights."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 request_id: str = "") -> AsyncIterator[Completion]:
        """Sample sampling.n completions per prompt; yields each as it finishes.

        Raises ValueError for a request the engine cannot run (empty prompt, too long for
        max_model_len). Closing the iterator early aborts the unfinished samples.
        """
        ...

    async def score(self, sequences: Sequence[ScoredSequence], top_k: int = 0,
                    request_id: str = "") -> list[SequenceScores]:
        """The logprob of every completion token of each sequence under the served weights (a
        distillation teacher's scores; nothing is sampled), with each position's top_k tokens
        when top_k > 0; one result per sequence, in order. ValueError for a sequence the engine
        cannot run (too long, ids outside the vocabulary); FailedPrecondition for an engine that
        cannot score."""
        ...

    async def load_weights(self, source: WeightSource, version: int) -> int:
        """Read `version` from `source` (the weight-sync group, shared-memory files or CUDA IPC
        handles; tandem.weight_source) and swap it in; returns the version now serving.

        If reading fails, the previous version keeps serving and the error is raised. If
        applying fails half-way, the engine stops serving (`serving` becomes False). Every read
        of a CUDA IPC source is done when this returns (the trainer may then free it).
        FailedPrecondition while the weights sleep, or for a source the engine cannot read.
        """
        ...

    async def sleep(self, level: int) -> tuple[MemoryKind, ...]:
        """Release device memory (level 1: weights to host memory, KV cache dropped; level 2:
        both dropped) once the calls in flight have finished; returns what is released. Generate
        is refused until everything is woken. FailedPrecondition where the engine has no sleep
        mode (only colocated generators on a GPU have one). Sleeping twice is a no-op."""
        ...

    async def wake_up(self, memory: Sequence[MemoryKind] | None = None) -> tuple[MemoryKind, ...]:
        """Bring back `memory` (None: all; waking what is awake is a no-op); returns what still
        sleeps. Generation resumes once nothing sleeps."""
        ...

    def info(self) -> GeneratorInfo:
        """Model, weight version, engine, dtype, capacity and sequences in flight."""
        ...

    @property
    def serving(self) -> bool:
        """False once the weights are no known version (an update failed while being applied)."""
        ...

    @property
    def dead(self) -> bool:
        """True once the engine itself died; only restarting the process recovers."""
        ...

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new generate calls (ConnectionError) and wait up to timeout_s for those in
        flight, and any weight swap, to finish; returns whether all did."""
        ...

    async def close(self) -> None:
        """Stop the engine and its processes (aborting calls still running)."""
        ...
