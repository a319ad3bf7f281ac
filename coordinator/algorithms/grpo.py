"""One synchronous GRPO step (DESIGN.md): prompts -> rollouts -> rewards -> advantages ->
train -> publish weights."""

from __future__ import annotations

import time

import torch

from coordinator import rollout
from coordinator.advantages import compute_advantages
from coordinator.algorithms.context import LoopContext
from coordinator.data import Example
from generator_svc.types import Completion, SamplingConfig
from reward_svc.types import ScoreItem
from trainer_svc.types import GrpoLossConfig, Sample


def grpo_step(ctx: LoopContext, step: int) -> dict[str, float]:
    cfg, log = ctx.cfg, ctx.log
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[f"time_{name}_s"] = now - clock
        clock = now

    batch = ctx.cursor.next_batch(cfg.grpo.num_prompts_per_step)
    prompts = [ctx.tokens.prompt(e.prompt) for e in batch]
    groups = rollout.generate(prompts, _sampling(ctx, step), ctx.services.generators,
                              ctx.services.generator_failed, log)
    lap("generate")
    rewards_PG, correct = _score(ctx, batch, groups)
    lap("score")
    advantages_PG = compute_advantages(rewards_PG, leave_one_out=cfg.grpo.use_leave_one_out_baseline,
                                       normalize=cfg.grpo.normalize_rewards)
    samples = [Sample(token_ids=prompt + list(c.token_ids), prompt_length=len(prompt),
                      generation_logprobs=list(c.logprobs), advantage=float(advantages_PG[p, g]))
               for p, (prompt, group) in enumerate(zip(prompts, groups)) for g, c in enumerate(group)]
    result = ctx.services.trainer.train_step(samples, _loss(ctx), global_batch_size=cfg.policy.train_global_batch_size,
                                             micro_batch_size=cfg.policy.train_micro_batch_size)
    lap("train")
    published = ctx.publish()
    lap("publish")
    versions = {c.weight_version for group in groups for c in group}
    return {
        **result.metrics,
        "reward_mean": float(rewards_PG.mean()),
        "accuracy_train": float(correct.float().mean()),
        "zero_variance_groups": float((rewards_PG.std(dim=1) == 0).sum()),
        "completion_length_mean": sum(len(c.token_ids) for g in groups for c in g) / len(samples),
        "truncated_fraction": sum(c.finish_reason == "length" for g in groups for c in g) / len(samples),
        "num_samples": float(len(samples)),
        "generation_weight_version": float(min(versions)),
        "weight_version": float(published.version),
        **timings,
    }


def _sampling(ctx: LoopContext, step: int) -> SamplingConfig:
    gen = ctx.cfg.policy.generation
    return SamplingConfig(n=ctx.cfg.grpo.num_generations_per_prompt, temperature=gen.temperature, top_p=gen.top_p,
                          top_k=gen.top_k if gen.top_k is not None else -1, max_tokens=gen.max_new_tokens,
                          seed=ctx.cfg.grpo.seed * 1_000_003 + step * 100_003)


def _loss(ctx: LoopContext) -> GrpoLossConfig:
    loss = ctx.cfg.loss_fn
    return GrpoLossConfig(ratio_clip_min=loss.ratio_clip_min, ratio_clip_max=loss.ratio_clip_max,
                          reference_policy_kl_penalty=loss.reference_policy_kl_penalty,
                          use_importance_sampling_correction=loss.use_importance_sampling_correction)


def _score(ctx: LoopContext, batch: list[Example], groups: list[list[Completion]]) -> tuple[torch.Tensor, torch.Tensor]:
    items = [ScoreItem(e.task, e.prompt, ctx.tokens.decode(c.token_ids), e.answer)
             for e, group in zip(batch, groups) for c in group]
    results = ctx.services.rewards().score(items)
    shape = (len(batch), len(groups[0]))
    rewards = torch.tensor([r.reward for r in results], dtype=torch.float32).view(shape)
    correct = torch.tensor([r.correct for r in results]).view(shape)
    return rewards, correct
