"""Advantage estimators, KL in the reward, DAPO (dynamic sampling, overlong filtering and
shaping) against hand-computed values, and one GRPO step with fake rollouts and trainer."""

import math
import threading
from types import SimpleNamespace

import pytest
import torch

from coordinator.algorithms import grpo as grpo_module
from coordinator.algorithms.dapo import overlong_penalties
from coordinator.algorithms.grpo import prepare_samples
from coordinator.config import ConfigError, load_config
from coordinator.data.examples import Example, PromptCursor
from coordinator.loop import rollouts as rollouts_module
from coordinator.loop.advantages import (
    build_advantage_fn,
    clip_advantages,
    kl_penalized_rewards,
    reinforce_plus_plus_advantages,
)
from coordinator.loop.groups import RolloutGroups
from coordinator.loop.ledger import DropReason
from coordinator.loop.multiturn import Episode
from coordinator.loop.rollouts import DynamicSamplingExhausted, dynamic_sampling
from trainer_svc.types import StepResult


def test_reinforce_plus_plus_raw_reward_and_clip():
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    # group-mean baseline: [0.5, -0.5], [0, 0]; batch mean 0, biased variance 0.125
    expected = [x / math.sqrt(0.125) for x in (0.5, -0.5, 0.0, 0.0)]
    assert reinforce_plus_plus_advantages(rewards).flatten().tolist() == pytest.approx(expected, rel=1e-5)
    # token weights 3, 1, 1, 1: mean (1.5 - 0.5) / 6 = 1/6, var (3 (1/3)^2 + (2/3)^2 + 2 (1/6)^2) / 6 = 5/36
    weighted = reinforce_plus_plus_advantages(rewards, torch.tensor([[3.0, 1.0], [1.0, 1.0]]))
    assert weighted.flatten().tolist() == pytest.approx([(x - 1 / 6) / math.sqrt(5 / 36) for x in (0.5, -0.5, 0.0, 0.0)],
                                                        rel=1e-5)
    raw = build_advantage_fn("raw_reward", leave_one_out=True, normalize=True, minus_baseline=True, clip=None)
    assert raw(rewards, None).tolist() == rewards.tolist()
    rloo = build_advantage_fn("grpo", leave_one_out=True, normalize=False, minus_baseline=True, clip=0.5)
    assert rloo(torch.tensor([[1.0, 0.0, 0.0]]), None).flatten().tolist() == pytest.approx([0.5, -0.5, -0.5])
    assert clip_advantages(torch.tensor([-3.0, 0.2, 3.0]), 1.0).tolist() == pytest.approx([-1.0, 0.2, 1.0])
    assert kl_penalized_rewards(rewards, torch.full((2, 2), 2.0), 0.1).flatten().tolist() == pytest.approx(
        [0.8, -0.2, 0.8, 0.8])
    with pytest.raises(ValueError):
        build_advantage_fn("ppo", leave_one_out=True, normalize=True, minus_baseline=True, clip=None)


def test_overlong_penalty_is_linear_in_the_buffer():
    lengths = torch.tensor([[10.0, 12.0, 14.0, 16.0]])
    penalties = overlong_penalties(lengths, max_response_length=16, buffer_length=4, penalty=1.0)
    assert penalties.flatten().tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0])


def _episode(reward, length=2, finish="stop", logprob=-1.0):
    return Episode("t", list(range(3, 3 + length)), [logprob] * length, None, reward, reward > 0, finish, 0, 1, [], True)


def _rollouts(rewards, finish=None, length=2, first_draw=None):
    groups = [[_episode(r, length, (finish or {}).get((p, g), "stop")) for g, r in enumerate(row)]
              for p, row in enumerate(rewards)]
    examples = [Example(f"q{p}", "a", "t", (1, p)) for p in range(len(rewards))]
    draws = () if first_draw is None else tuple(range(first_draw, first_draw + len(rewards)))
    return RolloutGroups(examples, [[1, 2]] * len(rewards), groups, torch.tensor(rewards),
                         torch.tensor(rewards) > 0, draws)


def test_dynamic_sampling_keeps_groups_with_variance_and_counts():
    rounds = [[[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]]
    calls = []

    def draw(round_index, size):
        calls.append((round_index, size))
        return _rollouts(rounds[round_index], first_draw=3 * round_index)

    result = dynamic_sampling(draw, 2, batch_multiplier=1.5, max_gen_batches=3)
    assert calls == [(0, 3), (1, 3)]
    assert result.rollouts.rewards_PG.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    # every draw accounted for (coordinator/loop/ledger.py): trained, or dropped with its reason
    assert result.rollouts.draws == (1, 3)
    assert sorted((d.group.draw, d.reason) for d in result.rollouts.dropped) == [
        (0, DropReason.ZERO_VARIANCE), (2, DropReason.ZERO_VARIANCE), (4, DropReason.ZERO_VARIANCE),
        (5, DropReason.SURPLUS)]
    assert result.metrics["dynamic_sampling_num_gen_batches"] == 2.0
    assert result.metrics["dynamic_sampling_num_zero_variance_groups"] == 3.0
    assert result.metrics["dynamic_sampling_num_discarded_valid_samples"] == 2.0  # one extra group of 2 samples
    assert result.metrics["filtered_reward"] == pytest.approx(0.5)
    with pytest.raises(DynamicSamplingExhausted, match="dynamic_sampling_max_gen_batches"):
        dynamic_sampling(lambda r, n: _rollouts([[1.0, 1.0]] * n), 2, batch_multiplier=1.0, max_gen_batches=2)


class _FakeTrainer:
    def __init__(self, reference_logprob=-1.0):
        self.reference_logprob = reference_logprob
        self.trained = None

    def logprobs(self, samples, policy="current", micro_batch_size=8):
        assert policy == "reference"
        return [[self.reference_logprob] * (len(s.token_ids) - s.prompt_length) for s in samples]

    def train_step(self, samples, loss, *, global_batch_size, micro_batch_size, learning_rate=None):
        self.trained = (samples, loss)
        return StepResult({"loss": 0.0}, 1)


def _ctx(overrides, trainer=None):
    cfg = load_config(overrides=["policy.train_global_batch_size=4", "grpo.num_prompts_per_step=2",
                                 "grpo.num_generations_per_prompt=2", *overrides])
    services = SimpleNamespace(trainer=trainer or _FakeTrainer())
    return SimpleNamespace(cfg=cfg, services=services, log=None, stopping=threading.Event())


def test_overlong_filtering_masks_truncated_samples_but_keeps_them_in_the_baseline():
    rollouts = _rollouts([[1.0, 0.0], [0.0, 0.0]], finish={(0, 1): "length"})
    samples, metrics = prepare_samples(_ctx(["grpo.overlong_filtering=true", "grpo.normalize_rewards=false"]), rollouts)
    assert [s.loss_mask for s in samples] == [None, [0.0, 0.0], None, None]
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0, 0.0, 0.0])  # baseline includes the 0
    assert metrics["overlong_filtered_samples"] == 1.0


def test_reward_shaping_and_kl_in_reward_change_the_advantages():
    rollouts = _rollouts([[1.0, 1.0]], length=4, finish={(0, 1): "length"})
    ctx = _ctx(["policy.generation.max_new_tokens=4", "grpo.reward_shaping.enabled=true",
                "grpo.reward_shaping.overlong_buffer_length=2", "grpo.normalize_rewards=false",
                "grpo.use_leave_one_out_baseline=false"])
    samples, metrics = prepare_samples(ctx, rollouts)
    # both length 4 = the budget: penalty -1 each, equal rewards, zero advantages
    assert metrics["overlong_penalty_mean"] == pytest.approx(-1.0)
    assert [s.advantage for s in samples] == pytest.approx([0.0, 0.0])

    rollouts = _rollouts([[1.0, 1.0]], length=2)
    rollouts.groups[0][1].logprobs[:] = [-2.0, -2.0]  # KL k1 per token = policy - ref = -1 -> sequence -2
    ctx = _ctx(["loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_penalty=0.5",
                "loss_fn.reference_policy_kl_type=k1", "grpo.normalize_rewards=false",
                "grpo.use_leave_one_out_baseline=false"], trainer=_FakeTrainer(reference_logprob=-1.0))
    samples, metrics = prepare_samples(ctx, rollouts)
    # rewards 1 - 0.5 * 0 = 1 and 1 - 0.5 * (-2) = 2: mean baseline 1.5
    assert [s.advantage for s in samples] == pytest.approx([-0.5, 0.5])
    assert metrics["kl_in_reward_mean"] == pytest.approx(-1.0)
    assert ctx.cfg.loss_fn.trainer_loss().reference_policy_kl_penalty == 0.0  # the KL left the loss


def test_config_maps_nemo_rl_loss_keys_and_rejects_bad_combinations():
    cfg = load_config(overrides=["loss_fn.token_level_loss=false", "loss_fn.sequence_level_importance_ratios=true",
                                 "loss_fn.ratio_clip_c=3", "loss_fn.reference_policy_kl_type=k2"])
    loss = cfg.loss_fn.trainer_loss()
    assert (loss.token_level_loss, loss.sequence_level_importance_ratios, loss.ratio_clip_c,
            loss.reference_policy_kl_type) == (False, True, 3.0, "k2")
    for bad in (["loss_fn.sequence_level_importance_ratios=true"], ["loss_fn.use_kl_in_reward=true"],
                ["grpo.reward_shaping.enabled=true"], ["grpo.adv_estimator.name=ppo"]):
        with pytest.raises(ConfigError):
            load_config(overrides=bad)


def test_grpo_step_with_dynamic_sampling_logs_its_counters(monkeypatch):
    draws = iter([[[1.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 0.0]]])

    def fake_collect(ctx, batch, prompts, sampling):
        rewards = next(draws)
        return _rollouts(rewards).groups

    monkeypatch.setattr(rollouts_module, "collect_episodes", fake_collect)
    trainer = _FakeTrainer()
    ctx = _ctx(["grpo.use_dynamic_sampling=true", "grpo.dynamic_sampling_max_gen_batches=2"], trainer)
    ctx.cursor = PromptCursor([Example(f"q{i}", "a", "t", (1, i)) for i in range(8)], seed=0)
    ctx.tokens = SimpleNamespace(prompt=lambda text: [1, 2])
    ctx.publish = lambda: SimpleNamespace(version=1)
    ctx.publisher = SimpleNamespace(version=0)
    ctx.trainer_version = 0  # the episodes were sampled by version 0: age 0
    ctx.release_generators = lambda: None
    metrics = grpo_module.grpo_step(ctx, 1)
    assert metrics["dynamic_sampling_num_gen_batches"] == 2.0
    assert metrics["dynamic_sampling_num_zero_variance_groups"] == 2.0
    assert metrics["zero_variance_groups"] == 0.0
    samples, loss = trainer.trained
    assert len(samples) == 4 and all(s.advantage != 0 for s in samples)
    assert loss == ctx.cfg.loss_fn.trainer_loss()
