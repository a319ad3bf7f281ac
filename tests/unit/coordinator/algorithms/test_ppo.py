"""PPO's step pieces (coordinator/algorithms/ppo.py) without services: GAE over the samples' own
per-token lists (loss masks, ragged lengths) against hand-computed values, and the policy's and
the critic's train steps, both called, the critic's metrics named critic_<name>."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from coordinator.algorithms.ppo import critic_valued, ppo_advantages, train_with_critic
from coordinator.config import load_config
from trainer_svc.types import GrpoLossConfig, Sample, StepResult, ValueLossConfig


def test_ppo_advantages_of_ragged_masked_samples():
    # gamma 1, lam 1 (A_t = reward-to-go - V_t; returns = the reward on every trained token):
    # sample 0: reward 1, 2 tokens, values [0.5, 0.25] -> A [0.5, 0.75], returns [1, 1]
    # sample 1: reward 0, 3 tokens, the middle one masked out (an environment's), values [0.5, 9, 0.5]
    #           -> A [-0.5, 0, -0.5], returns [0, 0, 0]
    advantages, returns, metrics = ppo_advantages([1.0, 0.0], [[0.5, 0.25], [0.5, 9.0, 0.5]],
                                                  [[1.0, 1.0], [1.0, 0.0, 1.0]], gamma=1.0, lam=1.0, normalize=False)
    assert advantages == [[0.5, 0.75], [-0.5, 0.0, -0.5]] and returns == [[1.0, 1.0], [0.0, 0.0, 0.0]]
    # the 4 trained tokens: values [0.5, 0.25, 0.5, 0.5], returns [1, 1, 0, 0]; residuals [0.5, 0.75, -0.5, -0.5]
    # (mean 0.0625; deviations 0.4375, 0.6875, -0.5625, -0.5625; variance 1.296875 / 4 = 0.32421875) against
    # the returns' variance 0.25: 1 - 0.32421875 / 0.25 = -0.296875
    assert metrics["value_mean"] == pytest.approx(0.4375) and metrics["return_mean"] == pytest.approx(0.5)
    assert metrics["explained_variance"] == pytest.approx(-0.296875)
    assert metrics["advantage_abs_mean"] == pytest.approx(0.5625)
    whitened, _, _ = ppo_advantages([1.0, 0.0], [[0.5, 0.25], [0.5, 9.0, 0.5]], [[1.0, 1.0], [1.0, 0.0, 1.0]],
                                    gamma=1.0, lam=1.0, normalize=True)
    trained = [whitened[0][0], whitened[0][1], whitened[1][0], whitened[1][2]]
    assert sum(trained) == pytest.approx(0.0, abs=1e-6) and whitened[1][1] == 0.0  # float32 lists


def test_values_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="the critic returned values"):
        ppo_advantages([1.0], [[0.5]], [[1.0, 1.0]], gamma=1.0, lam=1.0, normalize=False)


class _Trainer:
    def __init__(self, name: str, metrics: dict[str, float], values=None):
        self.name, self.metrics, self._values, self.calls = name, metrics, values, []

    def values(self, samples, micro_batch_size):
        return self._values

    def train_step(self, samples, loss, *, global_batch_size, micro_batch_size):
        self.calls.append((loss, global_batch_size, micro_batch_size, threading.current_thread().name))
        return StepResult(self.metrics, 7)


def _ctx(*overrides: str, values=None):
    cfg = load_config(overrides=["ppo.critic.cliprange_value=0.25", "ppo.normalize_advantages=false",
                                 "ppo.gamma=1", "ppo.lam=1", *overrides])
    services = SimpleNamespace(trainer=_Trainer("policy", {"loss": 1.0, "grad_norm": 2.0}),
                               critic=_Trainer("critic", {"value_loss": 0.5, "grad_norm": 3.0}, values))
    return SimpleNamespace(cfg=cfg, services=services)


def test_critic_valued_fills_each_samples_token_lists():
    ctx = _ctx(values=[[0.5, 0.25]])
    (valued,), metrics = critic_valued(ctx, [Sample([1, 2, 3, 4], 2, advantage=9.0)], [1.0])
    assert valued.token_advantages == [0.5, 0.75] and valued.returns == [1.0, 1.0] and valued.values == [0.5, 0.25]
    assert valued.advantage == 0.0 and metrics["value_mean"] == pytest.approx(0.375)


def test_train_with_critic_trains_both_and_names_the_critics_metrics():
    ctx = _ctx("ppo.critic.train_global_batch_size=4", "ppo.critic.train_micro_batch_size=2")
    result = train_with_critic(ctx, [Sample([1, 2], 1)], GrpoLossConfig())
    assert result.metrics == {"loss": 1.0, "grad_norm": 2.0, "critic_value_loss": 0.5, "critic_grad_norm": 3.0}
    (loss, global_batch, micro_batch, thread), = ctx.services.critic.calls
    assert loss == ValueLossConfig(cliprange_value=0.25) and (global_batch, micro_batch) == (4, 2)
    assert thread.startswith("critic-train")  # beside the policy's step, not after it
    policy = ctx.services.trainer.calls[0]
    assert policy[0] == GrpoLossConfig() and policy[1:3] == (ctx.cfg.policy.train_global_batch_size,
                                                             ctx.cfg.policy.train_micro_batch_size)
