"""The drift guard's decision (coordinator/loop/drift.py): when a run stops, and what the error says."""

import math

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.loop.drift import Drift, DriftGuard, StepError, drift_message
from coordinator.loop.drift_probe import ProbeResult


def feed(guard: DriftGuard, errors, *, bound=1.05, grace=2, first_version=3):
    verdicts = []
    for i, error in enumerate(errors):
        verdicts.append(guard.observe(i + 1, error, first_version + i, bound=bound, grace_steps=grace))
    return verdicts


def test_on_policy_noise_never_trips():
    assert feed(DriftGuard(), [1.0000007, 1.01, 1.049, 1.05] * 5) == [None] * 20


def test_trips_after_the_grace_steps_naming_the_first_version_over():
    guard = DriftGuard()
    verdicts = feed(guard, [1.0, 1.3, 460.0], first_version=7)
    assert verdicts[:2] == [None, None]
    drift = verdicts[2]
    assert drift.since_version == 8 and [s.step for s in drift.steps] == [2, 3]


def test_one_step_over_is_forgiven_when_the_next_is_back_under():
    guard = DriftGuard()
    assert feed(guard, [1.2, 1.0, 1.2, 1.0, 1.2]) == [None] * 5
    assert guard.steps_over_bound == 1


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_non_finite_error_counts_as_over(bad):
    assert feed(DriftGuard(), [bad], grace=1)[0] is not None


def test_no_bound_turns_the_guard_off():
    assert feed(DriftGuard(), [500.0] * 4, bound=None) == [None] * 4


def _drift():
    return Drift((StepError(4, 1.31, 5), StepError(5, 1.42, 6)), 1.05)


def test_the_message_names_the_metric_key_steps_version_and_the_drifted_generator():
    probes = [ProbeResult("generator-a", 6, 0.52, 1.14, 48), ProbeResult("generator-b", 6, 2e-6, 1.000001, 48)]
    text = drift_message(_drift(), probes)
    assert "token_mult_prob_error was 1.31 (step 4), 1.42 (step 5)" in text
    assert "grpo.max_token_mult_prob_error=1.05" in text and "grpo.drift_grace_steps" in text
    assert "weight version 5 onwards" in text
    assert "generator generator-a (weight version 6) DRIFTED: max |logprob difference| 0.52" in text
    assert "generator generator-b (weight version 6) agrees" in text


def test_the_message_still_says_what_drifted_when_the_probe_fails_or_all_agree():
    assert "probe failed: RpcError: gone" in drift_message(_drift(), ["RpcError: gone"])
    agree = drift_message(_drift(), [ProbeResult("generator-b", 6, 2e-6, 1.000001, 48)])
    assert "Every generator agrees" in agree and "weight version 5 onwards" in agree


def test_config_keys_default_and_validate():
    cfg = load_config()
    assert cfg.grpo.max_token_mult_prob_error == 1.05 and cfg.grpo.drift_grace_steps == 2
    assert load_config(overrides=["grpo.max_token_mult_prob_error=null"]).grpo.max_token_mult_prob_error is None
    with pytest.raises(ConfigError, match="grpo.max_token_mult_prob_error"):
        load_config(overrides=["grpo.max_token_mult_prob_error=0.9"])
