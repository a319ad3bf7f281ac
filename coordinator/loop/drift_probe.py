"""Ask each live generator and the trainer for the logprobs of the same completions.

The generators sample a few completions of fixed prompts (temperature 1, fixed seed, so
unlikely tokens are scored too); the trainer scores exactly those token ids with its current
policy. On-policy, the two agree to float precision (fp32: ~1e-5); a generator that serves
other weights than the trainer's shows at once. Used by the drift guard, when it trips, to say
which generator drifted, and by the model-family conformance tests after every publish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.generation.types import SamplingConfig
from trainer_svc.types import Sample


@dataclass(frozen=True)
class ProbeResult:
    """One generator against the trainer on the probe's completions."""

    member_id: str
    weight_version: int
    """The version the generator sampled the probe with."""
    max_abs_diff: float
    """Largest |generator logprob - trainer logprob| over the probe's tokens."""
    mult_prob_error: float
    """Mean exp(|generator - trainer|) over the tokens: token_mult_prob_error of the probe."""
    num_tokens: int


def probe_generators(services, prompts: Sequence[Sequence[int]], *, num_samples: int = 2, max_tokens: int = 8,
                     seed: int = 4242, timeout_s: float = 120.0) -> list[ProbeResult]:
    """Each live generator (whatever version it serves) against the trainer's current policy
    on `num_samples` sampled completions of each prompt (token ids, BOS included)."""
    sampling = SamplingConfig(n=num_samples, temperature=1.0, max_tokens=max_tokens, seed=seed)
    results = []
    for handle in services.all_generators():
        completions = list(handle.client.generate(prompts, sampling, request_id=f"drift-probe-{handle.member_id}",
                                                  timeout_s=timeout_s))
        samples = [Sample(token_ids=list(prompts[c.prompt_index]) + list(c.token_ids),
                          prompt_length=len(prompts[c.prompt_index])) for c in completions]
        trainer = services.trainer.logprobs(samples, micro_batch_size=max(len(samples), 1))
        diffs = [abs(g - t) for c, row in zip(completions, trainer) for g, t in zip(c.logprobs, row)]
        if not diffs:
            raise RuntimeError(f"generator {handle.member_id} returned no tokens for the drift probe")
        results.append(ProbeResult(handle.member_id, min(c.weight_version for c in completions), max(diffs),
                                   sum(math.exp(d) for d in diffs) / len(diffs), len(diffs)))
    return results


def check_drift(ctx, step: int, metrics: dict[str, float], prompts: Sequence[Sequence[int]]) -> None:
    """The drift guard's step (coordinator/loop/drift.py): feed it this step's token_mult_prob_error,
    log how many consecutive steps were over the bound (`drift_steps_over_bound`), and when it
    trips probe every generator and raise DriftError naming the ones that drifted."""
    from coordinator.loop.drift import DriftError, drift_message

    grpo = ctx.cfg.grpo
    error = metrics.get("token_mult_prob_error")
    if error is None:  # a loss that reports no such metric: nothing to guard
        return
    if metrics.get("trajectory_age_max", 0.0) > 0:
        # async GRPO trained on groups sampled by older weights: prev and generation logprobs differ by
        # the weights' own moves, not by drift. Only on-policy steps (age 0) say anything about it.
        metrics["drift_steps_over_bound"] = float(ctx.drift.steps_over_bound)
        return
    drift = ctx.drift.observe(step, error, int(metrics["generation_weight_version"]),
                              bound=grpo.max_token_mult_prob_error, grace_steps=grpo.drift_grace_steps)
    metrics["drift_steps_over_bound"] = float(ctx.drift.steps_over_bound)
    if drift is None:
        return
    try:
        probes: list = probe_generators(ctx.services, list(prompts)[:4],
                                        max_tokens=min(8, ctx.cfg.policy.generation.max_new_tokens))
    except Exception as exc:  # noqa: BLE001 - whatever the probe hit, the error must still say what drifted
        probes = [f"{type(exc).__name__}: {exc}"[:300]]
    message = drift_message(drift, probes)
    ctx.log.error("drift_guard_tripped", step=step, since_version=drift.since_version, message=message)
    raise DriftError(message)
