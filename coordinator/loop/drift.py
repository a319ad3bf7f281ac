"""The drift guard: stop a GRPO run whose generators sample from other weights than the trainer's.

Every GRPO step the trainer reports `token_mult_prob_error`, the mean over the step's tokens of
exp(|trainer logprob - generator logprob|) (NeMo-RL's metric). On-policy it is 1 up to float
noise (fp32: 1.000001; bf16: ~1.01). A generator that serves weights the trainer does not hold
(a weight update that did not land, a tied output head left stale, another checkpoint) pushes
it far above: the loss then trains on garbage importance weights and nothing else says so.

`DriftGuard.observe` is fed each step's error and the weight version that sampled the step.
Once the error has been above `bound` (`grpo.max_token_mult_prob_error`, default 1.05) on
`grace_steps` consecutive steps (`grpo.drift_grace_steps`, default 2: one noisy step is
forgiven), it returns a `Drift`; `drift_message` turns it, with the per-generator probe of
coordinator/loop/drift_probe.py, into the error that stops the run. Pure: no I/O, no services.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class DriftError(RuntimeError):
    """The generators' logprobs stopped matching the trainer's; the message says where and since when."""


@dataclass(frozen=True)
class StepError:
    step: int
    error: float
    generation_version: int
    """The (oldest) weight version that sampled the step's completions."""


@dataclass(frozen=True)
class Drift:
    """`grace_steps` consecutive steps over `bound`."""

    steps: tuple[StepError, ...]
    bound: float

    @property
    def since_version(self) -> int:
        return self.steps[0].generation_version


@dataclass
class DriftGuard:
    """Counts consecutive GRPO steps whose token_mult_prob_error is over the bound."""

    over: list[StepError] = field(default_factory=list)

    def observe(self, step: int, error: float, generation_version: int, *, bound: float | None,
                grace_steps: int) -> Drift | None:
        """Record one step; a Drift once `grace_steps` consecutive steps are over `bound`
        (a non-finite error counts as over). bound None: the guard is off."""
        if bound is None:
            return None
        if math.isfinite(error) and error <= bound:
            self.over.clear()
            return None
        self.over.append(StepError(step, error, generation_version))
        if len(self.over) < grace_steps:
            return None
        return Drift(tuple(self.over[-grace_steps:]), bound)

    @property
    def steps_over_bound(self) -> int:
        """Consecutive steps over the bound so far (logged every step)."""
        return len(self.over)


def drift_message(drift: Drift, probes: Sequence, *, tolerance: float = 1e-3) -> str:
    """The run-stopping error: what drifted (the metric, its values, the bound and its key),
    since which weight version, and which generators disagree with the trainer now (`probes`:
    coordinator.loop.drift_probe.ProbeResult, one per generator; a probe error is a str)."""
    first, last = drift.steps[0], drift.steps[-1]
    values = ", ".join(f"{s.error:.4g} (step {s.step})" for s in drift.steps)
    lines = [(f"generator/trainer mismatch: token_mult_prob_error was {values}, over the bound "
              f"grpo.max_token_mult_prob_error={drift.bound} for {len(drift.steps)} consecutive steps "
              f"(grpo.drift_grace_steps); the samples came from weight version {drift.since_version} onwards "
              f"(step {first.step} to {last.step}).")]
    drifted = [p for p in probes if not isinstance(p, str) and p.max_abs_diff > tolerance]
    for p in probes:
        if isinstance(p, str):
            lines.append(f"probe failed: {p}")
        else:
            verdict = "DRIFTED" if p in drifted else "agrees"
            lines.append(f"generator {p.member_id} (weight version {p.weight_version}) {verdict}: max |logprob "
                         f"difference| {p.max_abs_diff:.3g} against the trainer, token_mult_prob_error "
                         f"{p.mult_prob_error:.4g} on {p.num_tokens} probe tokens.")
    if drifted:
        lines.append("The generators named DRIFTED serve other weights than the trainer's: check that the "
                     "generators load the trainer's checkpoint (policy.model_name), the same dtype "
                     "(policy.precision), and that weight updates reach them (their logs).")
    elif probes:
        lines.append("Every generator agrees with the trainer on a fresh probe: the mismatch was in the step's "
                     "samples (a generator that has since been replaced, or sampling settings the trainer does "
                     "not reproduce).")
    lines.append("To train on regardless, raise grpo.max_token_mult_prob_error or set it to null.")
    return "\n".join(lines)
