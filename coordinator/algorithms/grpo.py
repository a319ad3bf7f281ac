"""GRPO (and DAPO; docs/architecture.md), read top to bottom: `train_grpo` is the loop,
`grpo_step` one step of it, `prepare_samples` the step's arithmetic between rewards and trainer.

    for step in first..last:                                          train_grpo
        rollouts   = the step's prompt groups, sampled and scored      loop/rollouts.py via loop/pipeline.py
        samples    = rewards -> shaping, KL -> advantages, loss masks  prepare_samples
        teacher    = a distillation teacher's logprobs of the samples  algorithms/distillation.py (distillation runs)
        (ppo runs: the critic's values and GAE replace the estimator,  algorithms/ppo.py
         and the critic trains beside the policy)

        train      = one TrainStep on the trainer service              trainer_svc
        publish    = the new weights to the generators                 loop/context.py
        validate / checkpoint when their period comes                  the run (run/grpo_run.py)

The rollouts come from the rollout pipeline: produced when the step asks for them (synchronous
GRPO), or ahead, while earlier steps train, within grpo.async_grpo's age bound (async GRPO).
Colocated on GPUs the generators sleep from the end of the rollouts to the publish
(loop/weights/phases.py); elsewhere that call does nothing.

From rewards to samples, each switched by its config key and nothing else:

    rewards   = task rewards
              + overlong penalty                      grpo.reward_shaping.enabled (algorithms/dapo.py)
              - beta * sum_t KL_t(generator || ref)   loss_fn.use_kl_in_reward (beta: reference_policy_kl_penalty)
    advantage = estimator(rewards), clipped           grpo.adv_estimator.name, grpo.advantage_clip
    loss mask = 0 on truncated completions            grpo.overlong_filtering (algorithms/dapo.py)

The KL in the reward uses the generator's logprobs of the sampled tokens as the policy side and
the trainer's reference logprobs (one ComputeLogprobs call), with loss_fn's estimator and clamps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch

from coordinator.algorithms.dapo import loss_token_counts, overlong_loss_masks, overlong_penalties
from coordinator.algorithms.distillation import teacher_scored
from coordinator.algorithms.ppo import critic_valued, train_with_critic
from coordinator.loop.advantages import build_advantage_fn, kl_penalized_rewards
from coordinator.loop.context import LoopContext
from coordinator.loop.drift_probe import check_drift
from coordinator.loop.groups import RolloutGroups
from coordinator.loop.ledger import StepSamples
from coordinator.loop.pipeline import RolloutPipeline
from coordinator.loop.rollouts import rollout_pipeline
from coordinator.loop.scoring import per_task_metrics
from tandem.kl import kl_estimate
from trainer_svc.types import LossConfig, Sample


class StepRecorder(Protocol):
    def over(self, steps: range) -> Iterator[int]:
        """The steps, each after a liveness check of the run's services."""

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Log the step's metrics (metrics.jsonl, status, progress), with its wall time."""


class GRPORun(Protocol):
    """What the loop needs of the run around it (coordinator/run/grpo_run.py)."""

    def steps(self, phase: str, total: int, *, done: int) -> AbstractContextManager[StepRecorder]:
        """Record a phase's steps."""

    def validate(self, ctx: LoopContext, step: int) -> float:
        """Held-out accuracy of the published weights."""

    def checkpoint(self, ctx: LoopContext, step: int, metrics: dict[str, float], cursor: dict[str, int]) -> None:
        """Save the trainer's state and the loop's after `step`."""

    def trained(self, samples: StepSamples) -> None:
        """Record which samples a step trained on (its ledger record, before its checkpoint)."""

    def service_restarts(self) -> int:
        """Services relaunched so far."""

    @property
    def validates(self) -> bool:
        """Whether the run has held-out examples to validate on."""


def train_grpo(ctx: LoopContext, run: GRPORun, rollouts: RolloutPipeline, *, first_step: int = 1) -> None:
    """GRPO steps first_step..grpo.max_num_steps."""
    grpo, checkpointing = ctx.cfg.grpo, ctx.cfg.checkpointing
    last = grpo.max_num_steps
    rollouts.start(first_step, last)
    with run.steps("grpo", last, done=first_step - 1) as steps:
        for step in steps.over(range(first_step, last + 1)):
            rewarding = ctx.reward_seconds  # async: reward calls of the batches rolled out meanwhile count too
            metrics = grpo_step(ctx, step, rollouts)
            metrics["time_reward_s"] = ctx.reward_seconds - rewarding
            if run.validates and grpo.val_period and step % grpo.val_period == 0 and step < last:
                ctx.wait_published()  # async: validate the step's own weights
                metrics["val_accuracy"] = run.validate(ctx, step)
            metrics["service_restarts"] = float(run.service_restarts())
            run.trained(rollouts.samples_of(step))
            if checkpointing.enabled and step % checkpointing.save_period == 0:
                ctx.wait_published()  # the checkpoint records the version the generators serve
                run.checkpoint(ctx, step, metrics, rollouts.cursor_after(step))
            steps.record(step, metrics)
    ctx.wait_published()


def grpo_step(ctx: LoopContext, step: int, rollouts: RolloutPipeline | None = None) -> dict[str, float]:
    """One step: rollouts -> samples -> train -> publish. `rollouts`: the run's pipeline (started
    at its first step); None: a pipeline for this step alone."""
    cfg, timings = ctx.cfg, PhaseTimes()
    batch = (rollouts or rollout_pipeline(ctx)).take(step)  # generation and scoring
    ctx.release_generators()  # no generation from here to the publish (generators sharing its memory sleep)
    with timings("advantages"):
        samples, advantage_metrics = prepare_samples(ctx, batch.rollouts)
    if cfg.distillation is not None:  # the teacher scores the samples (algorithms/distillation.py)
        with timings("teacher"):
            samples, teacher_metrics = teacher_scored(ctx, samples)
        advantage_metrics.update(teacher_metrics)
    with timings("train"):
        if cfg.ppo is not None:  # the policy and the critic train at once (algorithms/ppo.py)
            result = train_with_critic(ctx, samples, trainer_loss(ctx))
        else:
            result = ctx.services.trainer.train_step(samples, trainer_loss(ctx),
                                                     global_batch_size=cfg.policy.train_global_batch_size,
                                                     micro_batch_size=cfg.policy.train_micro_batch_size)
    with timings("publish"):
        version = publish(ctx, step, rollouts)
    metrics = {**result.metrics, **rollout_metrics(batch.rollouts), **batch.metrics, **advantage_metrics,
               "weight_version": float(version), **timings.metrics}
    check_drift(ctx, step, metrics, batch.rollouts.prompts)  # stops a run whose generators drifted from the trainer
    return metrics


def trainer_loss(ctx: LoopContext) -> LossConfig:
    """The loss the trainer trains the rollouts with: distillation's when the run distills, else loss_fn's."""
    distillation = ctx.cfg.distillation
    return distillation.trainer_loss() if distillation is not None else ctx.cfg.loss_fn.trainer_loss()


def publish(ctx: LoopContext, step: int, rollouts: RolloutPipeline | None) -> int:
    """Publish the step's weights; async GRPO detaches it (the trainer trains on while they travel)."""
    if rollouts is not None and rollouts.max_age > 0:
        return ctx.publish_detached(on_published=lambda: rollouts.published(step))
    version = ctx.publish().version
    if rollouts is not None:
        rollouts.published(step)
    return version


def prepare_samples(ctx: LoopContext, rollouts: RolloutGroups) -> tuple[list[Sample], dict[str, float]]:
    """The trainer samples of `rollouts` (see the module docstring) and their metrics."""
    cfg, grpo = ctx.cfg, ctx.cfg.grpo
    rewards = rollouts.rewards_PG.to(torch.float32)
    metrics: dict[str, float] = {}
    shaping = grpo.reward_shaping
    if shaping.enabled:
        penalty = overlong_penalties(rollouts.lengths_PG(),
                                     max_response_length=shaping.max_response_length or cfg.policy.generation.max_new_tokens,
                                     buffer_length=shaping.overlong_buffer_length,
                                     penalty=shaping.overlong_buffer_penalty)
        rewards = rewards + penalty
        metrics["overlong_penalty_mean"] = float(penalty.mean())
    if cfg.loss_fn.use_kl_in_reward:
        kl_PG = sequence_kl(ctx, rollouts)
        rewards = kl_penalized_rewards(rewards, kl_PG, cfg.loss_fn.reference_policy_kl_penalty)
        metrics["kl_in_reward_mean"] = float(kl_PG.mean())
    masks = [e.loss_mask for group in rollouts.groups for e in group]
    if grpo.overlong_filtering:
        masks = overlong_loss_masks(rollouts)
        metrics["overlong_filtered_samples"] = float(sum(e.finish_reason == "length"
                                                         for group in rollouts.groups for e in group))
    if cfg.ppo is not None:  # a learned baseline: the critic's values and GAE (algorithms/ppo.py)
        samples, ppo_metrics = critic_valued(ctx, rollouts.samples(None, masks), rewards.flatten().tolist())
        metrics.update(reward_shaped_mean=float(rewards.mean()), **ppo_metrics)
        return samples, metrics
    counts = loss_token_counts(rollouts, masks)
    estimator = grpo.adv_estimator
    advantage_fn = build_advantage_fn(estimator.name, leave_one_out=grpo.use_leave_one_out_baseline,
                                      normalize=grpo.normalize_rewards, minus_baseline=estimator.minus_baseline,
                                      clip=grpo.advantage_clip)
    advantages = advantage_fn(rewards, counts)
    metrics.update(reward_shaped_mean=float(rewards.mean()), advantage_abs_mean=float(advantages.abs().mean()))
    return rollouts.samples(advantages, masks), metrics


def sequence_kl(ctx: LoopContext, rollouts: RolloutGroups) -> torch.Tensor:
    """(P, G): per completion, the sum over its tokens of the KL estimate of the generating
    policy against the trainer's reference policy."""
    loss = ctx.cfg.loss_fn
    samples = rollouts.samples()
    reference = ctx.services.trainer.logprobs(samples, policy="reference",
                                              micro_batch_size=ctx.cfg.policy.logprob_batch_size)
    totals = []
    for s, ref in zip(samples, reference):  # only the model's own tokens (multi-turn masks skip the environment's)
        kl = kl_estimate(torch.tensor(s.generation_logprobs), torch.tensor(ref), loss.reference_policy_kl_type,
                         input_clamp=loss.kl_input_clamp_value, output_clamp=loss.kl_output_clamp_value)
        totals.append(float(kl.sum() if s.loss_mask is None else (kl * torch.tensor(s.loss_mask)).sum()))
    return torch.tensor(totals, dtype=torch.float32).view(rollouts.rewards_PG.shape)


def rollout_metrics(rollouts: RolloutGroups) -> dict[str, float]:
    """Rewards, accuracy (overall and per task), lengths and the oldest weight version that sampled."""
    episodes = [e for group in rollouts.groups for e in group]
    rewards_PG, correct = rollouts.rewards_PG, rollouts.correct_PG
    return {
        "reward_mean": float(rewards_PG.mean()),
        "accuracy_train": float(correct.float().mean()),
        **per_task_metrics([e.task for e in episodes], rewards_PG.flatten().tolist(), correct.flatten().tolist(),
                           [e.num_turns for e in episodes]),
        "zero_variance_groups": float((rewards_PG.std(dim=1) == 0).sum()),
        "completion_length_mean": sum(len(e.token_ids) for e in episodes) / len(episodes),
        "truncated_fraction": sum(e.finish_reason == "length" for e in episodes) / len(episodes),
        "num_samples": float(len(episodes)),
        "generation_weight_version": float(min(e.weight_version for e in episodes)),
    }


class PhaseTimes:
    """Wall time of each named phase of a step, as `time_<phase>_s` metrics."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.metrics[f"time_{phase}_s"] = time.perf_counter() - started
