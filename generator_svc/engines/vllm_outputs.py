"""Pure mapping from vLLM's per-request outputs to `Completion` (no vLLM import: unit-testable).

vLLM is asked for `logprobs=0`, so each step's logprob dict holds exactly the sampled
token's entry; in vLLM's default `raw_logprobs` mode that value is untempered. The engine
labels every output step with the weight version set while generation was paused;
vLLM hands back the labels as spans over the completion's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tandem.generation.types import Completion, FinishReason, SequenceScores

# "repetition" is a stop condition vLLM detects itself (not enabled by Tandem); "error" is
# a request-level engine failure: the sample is unusable, like an aborted one.
_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop", "length": "length", "abort": "abort", "error": "abort", "repetition": "stop",
}


class _Span(Protocol):
    version: str
    start: int
    end: int


def finish_reason_from_vllm(reason: str | None) -> FinishReason:
    """vLLM's finish reason string as Tandem's."""
    if reason is None:
        raise AssertionError("a finished vLLM output has no finish reason")
    try:
        return _FINISH_REASONS[reason]
    except KeyError:
        raise AssertionError(f"unknown vLLM finish reason {reason!r}") from None


def sampled_logprobs(token_ids: Sequence[int], steps: Sequence[Mapping[int, Any]] | None) -> tuple[float, ...]:
    """The logprob of each sampled token, from vLLM's per-step {token_id: Logprob} dicts."""
    if steps is None:
        raise AssertionError("vLLM returned no logprobs although logprobs=0 was requested")
    if len(steps) != len(token_ids):
        raise AssertionError(f"{len(token_ids)} tokens but {len(steps)} logprob steps")
    return tuple(float(step[token].logprob) for token, step in zip(token_ids, steps))


def weight_version_of(spans: Sequence[_Span] | None, current: int) -> int:
    """The weight version that sampled a completion.

    Versions change only while generation is paused with in-flight requests drained, so
    a completion has one span. Were it ever to straddle two, the oldest is reported
    (the conservative choice for staleness checks). No spans (an empty completion): the
    version current when it finished.
    """
    if not spans:
        return current
    return min(int(span.version) for span in spans)


def to_completion(output: Any, prompt_index: int, sample_index: int, current_version: int) -> Completion:
    """A finished vLLM `CompletionOutput` as a `Completion`."""
    token_ids = tuple(int(t) for t in output.token_ids)
    return Completion(
        prompt_index=prompt_index,
        sample_index=sample_index,
        token_ids=token_ids,
        logprobs=sampled_logprobs(token_ids, output.logprobs) if token_ids else (),
        finish_reason=finish_reason_from_vllm(output.finish_reason),
        weight_version=weight_version_of(getattr(output, "weight_versions", None), current_version),
        routed_experts=flat_routes(getattr(output, "routed_experts", None)),
    )


def flat_routes(routed_experts: Any) -> tuple[int, ...]:
    """vLLM's routed experts of one completion ([positions, MoE layers, k] integers, or None when
    not asked for) as the flat row-major tuple a `Completion` carries."""
    if routed_experts is None:
        return ()
    return tuple(int(e) for e in routed_experts.reshape(-1).tolist())


def sequence_scores(token_ids: Sequence[int], prompt_length: int, prompt_logprobs: Sequence[Mapping[int, Any] | None] | None,
                    top_k: int) -> SequenceScores:
    """A teacher's scores from vLLM's `prompt_logprobs` of the whole sequence (sent as the prompt):
    entry j (None for j = 0) maps token ids to Logprobs at position j, holding token_ids[j] and,
    with prompt_logprobs=k, the k most likely tokens. Positions prompt_length.. are the completion's."""
    if prompt_logprobs is None or len(prompt_logprobs) != len(token_ids):
        raise AssertionError(f"vLLM returned {None if prompt_logprobs is None else len(prompt_logprobs)} prompt "
                             f"logprob entries for a {len(token_ids)}-token sequence")
    positions = prompt_logprobs[prompt_length:]
    logprobs = tuple(float(step[token].logprob) for token, step in zip(token_ids[prompt_length:], positions))
    if top_k <= 0:
        return SequenceScores(logprobs)
    top = tuple(tuple((int(t), float(lp.logprob)) for t, lp in sorted(step.items(), key=lambda kv: kv[1].rank)
                      if lp.rank is not None and lp.rank <= top_k)
                for step in positions)
    return SequenceScores(logprobs, top)
