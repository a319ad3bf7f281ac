"""One synchronous GRPO step (DESIGN.md): prompts -> rollouts -> rewards -> advantages ->
train -> publish weights. Colocated on GPUs the generators sleep from the end of the rollouts
to the publish (coordinator/colocation.py); elsewhere those two calls do nothing."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from coordinator.algorithms.context import LoopContext
from coordinator.algorithms.dapo import draw_rollouts
from coordinator.algorithms.groups import RolloutGroups
from coordinator.algorithms.grpo_batch import prepare_samples
from coordinator.drift_probe import check_drift
from coordinator.multiturn import Episode, collect_episodes
from coordinator.scoring import per_task_metrics
from generator_svc.types import SamplingConfig
from trainer_svc.types import GrpoLossConfig


def grpo_step(ctx: LoopContext, step: int) -> dict[str, float]:
    cfg = ctx.cfg
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[f"time_{name}_s"] = now - clock
        clock = now

    def draw(round_index: int, num_prompts: int) -> RolloutGroups:
        batch = ctx.cursor.next_batch(num_prompts)
        prompts = [ctx.tokens.prompt(e.prompt) for e in batch]
        sampling = _sampling(ctx, step)
        if round_index and sampling.seed is not None:  # a later dynamic-sampling round of this step
            sampling = replace(sampling, seed=sampling.seed + round_index * 7919)
        # single-turn tasks: generate, then Score; multi-turn tasks: episodes stepped by their environment
        groups = collect_episodes(ctx, batch, prompts, sampling)
        return RolloutGroups(batch, prompts, groups, *_rewards(groups))

    rollouts, sampling_metrics = draw_rollouts(cfg.grpo, draw)  # DAPO dynamic sampling when enabled
    groups, rewards_PG, correct = rollouts.groups, rollouts.rewards_PG, rollouts.correct_PG
    ctx.release_generators()  # no generation from here to the publish
    lap("rollout")  # generation and scoring (multi-turn episodes interleave the two), then the generators' sleep
    samples, advantage_metrics = prepare_samples(ctx, rollouts)  # shaping, KL in reward, advantages, masks
    lap("advantages")
    result = ctx.services.trainer.train_step(samples, _loss(ctx), global_batch_size=cfg.policy.train_global_batch_size,
                                             micro_batch_size=cfg.policy.train_micro_batch_size)
    lap("train")
    published = ctx.publish()
    lap("publish")
    versions = {c.weight_version for group in groups for c in group}
    metrics = {
        **result.metrics,
        "reward_mean": float(rewards_PG.mean()),
        **sampling_metrics,
        **advantage_metrics,
        "accuracy_train": float(correct.float().mean()),
        **per_task_metrics([e.task for g in groups for e in g], rewards_PG.flatten().tolist(), correct.flatten().tolist(),
                           [e.num_turns for g in groups for e in g]),
        "zero_variance_groups": float((rewards_PG.std(dim=1) == 0).sum()),
        "completion_length_mean": sum(len(c.token_ids) for g in groups for c in g) / len(samples),
        "truncated_fraction": sum(c.finish_reason == "length" for g in groups for c in g) / len(samples),
        "num_samples": float(len(samples)),
        "generation_weight_version": float(min(versions)),
        "weight_version": float(published.version),
        **timings,
    }
    check_drift(ctx, step, metrics, rollouts.prompts)  # stops a run whose generators drifted from the trainer
    return metrics


def _sampling(ctx: LoopContext, step: int) -> SamplingConfig:
    gen = ctx.cfg.policy.generation
    return SamplingConfig(n=ctx.cfg.grpo.num_generations_per_prompt, temperature=gen.temperature, top_p=gen.top_p,
                          top_k=gen.top_k if gen.top_k is not None else -1, max_tokens=gen.max_new_tokens,
                          seed=ctx.cfg.grpo.seed * 1_000_003 + step * 100_003)


def _loss(ctx: LoopContext) -> GrpoLossConfig:
    return ctx.cfg.loss_fn.trainer_loss()


def _rewards(groups: list[list[Episode]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, G] episode returns and correctness."""
    rewards = torch.tensor([[e.reward for e in group] for group in groups], dtype=torch.float32)
    correct = torch.tensor([[e.correct for e in group] for group in groups])
    return rewards, correct
