"""One GRPO step (docs/architecture.md): prompts -> rollouts -> rewards -> advantages -> train -> publish
weights. The rollouts come from the rollout pipeline (coordinator/loop/pipeline.py): produced
when the step asks for them (synchronous GRPO), or ahead, while earlier steps train, within
grpo.async_grpo's age bound (async GRPO). Colocated on GPUs the generators sleep from the end of
the rollouts to the publish (coordinator/loop/weights/phases.py); elsewhere that call does nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from coordinator.algorithms.dapo import draw_rollouts
from coordinator.algorithms.grpo_samples import prepare_samples
from coordinator.loop.context import LoopContext
from coordinator.loop.drift_probe import check_drift
from coordinator.loop.groups import RolloutGroups
from coordinator.loop.multiturn import Episode, collect_episodes
from coordinator.loop.pipeline import RolloutPipeline
from coordinator.loop.scoring import per_task_metrics
from tandem.generation.types import SamplingConfig


def grpo_step(ctx: LoopContext, step: int, rollouts: RolloutPipeline | None = None) -> dict[str, float]:
    """`rollouts`: the run's pipeline (started at its first step); None: a pipeline for this step alone."""
    cfg, timings = ctx.cfg, PhaseTimes()
    batch = (rollouts or grpo_pipeline(ctx)).take(step)  # generation and scoring (rollout_round)
    ctx.release_generators()  # no generation from here to the publish (colocated GPU generators sleep)
    with timings("advantages"):  # reward shaping, KL in the reward, advantages, loss masks
        samples, advantage_metrics = prepare_samples(ctx, batch.rollouts)
    with timings("train"):
        result = ctx.services.trainer.train_step(samples, cfg.loss_fn.trainer_loss(),
                                                 global_batch_size=cfg.policy.train_global_batch_size,
                                                 micro_batch_size=cfg.policy.train_micro_batch_size)
    with timings("publish"):
        version = publish(ctx, step, rollouts)
    metrics = {**result.metrics, **rollout_metrics(batch.rollouts), **batch.metrics, **advantage_metrics,
               "weight_version": float(version), **timings.metrics}
    check_drift(ctx, step, metrics, batch.rollouts.prompts)  # stops a run whose generators drifted from the trainer
    return metrics


def publish(ctx: LoopContext, step: int, rollouts: RolloutPipeline | None) -> int:
    """Publish the step's weights; async GRPO detaches it (the trainer trains on while they travel)."""
    if rollouts is not None and rollouts.max_age > 0:
        return ctx.publish_detached(on_published=lambda: rollouts.published(step))
    version = ctx.publish().version
    if rollouts is not None:
        rollouts.published(step)
    return version


def grpo_pipeline(ctx: LoopContext) -> RolloutPipeline:
    """The run's rollout pipeline: each step's prompt groups by rollout_round (DAPO's dynamic
    sampling when enabled), within grpo.async_grpo's age bound (0: synchronous)."""
    grpo = ctx.cfg.grpo

    def produce(step: int, num_groups: int) -> tuple[RolloutGroups, dict[str, float]]:
        return draw_rollouts(grpo, lambda r, n: rollout_round(ctx, step, r, n), num_groups)

    return RolloutPipeline(produce, grpo.num_prompts_per_step, max_age=grpo.async_grpo.max_age,
                           trainer_version=lambda: ctx.trainer_version, cursor_state=lambda: ctx.cursor.state(),
                           log=ctx.log, stopping=ctx.stopping)


def rollout_round(ctx: LoopContext, step: int, round_index: int, num_prompts: int) -> RolloutGroups:
    """The next `num_prompts` prompts, rolled out and scored (one round of dynamic sampling)."""
    batch = ctx.cursor.next_batch(num_prompts)
    prompts = [list(e.prompt_ids) for e in batch]
    sampling = step_sampling(ctx, step)
    if round_index and sampling.seed is not None:  # a later dynamic-sampling round of this step
        sampling = replace(sampling, seed=sampling.seed + round_index * 7919)
    groups = collect_episodes(ctx, batch, prompts, sampling)
    return RolloutGroups(batch, prompts, groups, *_rewards(groups))


def step_sampling(ctx: LoopContext, step: int) -> SamplingConfig:
    """The step's sampling: the config's, seeded by (grpo.seed, step) so a resumed run repeats it."""
    gen = ctx.cfg.policy.generation
    return SamplingConfig(n=ctx.cfg.grpo.num_generations_per_prompt, temperature=gen.temperature, top_p=gen.top_p,
                          top_k=gen.top_k if gen.top_k is not None else -1, max_tokens=gen.max_new_tokens,
                          seed=ctx.cfg.grpo.seed * 1_000_003 + step * 100_003)


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


def _rewards(groups: list[list[Episode]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, G] episode returns and correctness."""
    rewards = torch.tensor([[e.reward for e in group] for group in groups], dtype=torch.float32)
    correct = torch.tensor([[e.correct for e in group] for group in groups])
    return rewards, correct
