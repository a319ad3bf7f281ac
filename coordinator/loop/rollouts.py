"""Where a GRPO step's rollouts come from: prompts are drawn, sampled by the generators and
scored by the reward services, in rounds until the step has its prompt groups.

    rollout_pipeline(ctx)   the run's producer of batches (loop/pipeline.py: sync or async)
      produce_batch           one step's groups: one round, or DAPO's dynamic sampling
        rollout_round           draw prompts -> collect_episodes -> rewards as (P, G) tensors
          collect_episodes        single-turn tasks: Generate + Score; multi-turn: run_episodes
                                  (loop/multiturn.py: Generate + Step until the episode ends)

Dynamic sampling (`grpo.use_dynamic_sampling`, DAPO https://arxiv.org/abs/2503.14476): prompt
groups whose task rewards all agree carry no signal and are dropped; more prompts are drawn
(batch_multiplier x num_prompts_per_step per round) until num_prompts_per_step groups remain,
at most dynamic_sampling_max_gen_batches rounds, then a clear error. Groups are judged on the
raw task rewards, before shaping.

Sampling is seeded by (grpo.seed, step), and a later round of the same step by its index, so a
resumed run draws the same completions.

Every group keeps its prompt's draw index (PromptCursor.drawn), which with the generation index
and the weight version is each sample's id in the run's ledger (loop/ledger.py); the groups
dynamic sampling discards are kept as dropped, with their reason. Async GRPO's groups that grew
too old before their step took them are sampled again from the same prompts (`resample`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from coordinator.data.examples import Example
from coordinator.loop import rollout
from coordinator.loop.gateway.agents import AgentRunner
from coordinator.loop.gateway.service import GatewayDefaults
from coordinator.loop.groups import RolloutGroups
from coordinator.loop.ledger import DropReason
from coordinator.loop.multiturn import Episode, multi_turn_tasks, run_episodes
from coordinator.loop.pipeline import RolloutPipeline
from reward_svc.types import ScoreItem
from tandem.generation.types import Completion, SamplingConfig


def rollout_pipeline(ctx) -> RolloutPipeline:
    """The run's rollout pipeline over `ctx` (a coordinator.loop.context.LoopContext): each step's
    groups by produce_batch, within grpo.async_grpo's age bound (0: synchronous)."""
    grpo = ctx.cfg.grpo
    return RolloutPipeline(lambda step, num_groups: produce_batch(ctx, step, num_groups), grpo.num_prompts_per_step,
                           resample=lambda step, stale: resample(ctx, step, stale), max_age=grpo.async_grpo.max_age, trainer_version=lambda: ctx.trainer_version,
                           cursor_state=lambda: ctx.cursor.state(), log=ctx.log, stopping=ctx.stopping)


def produce_batch(ctx, step: int, num_groups: int) -> tuple[RolloutGroups, dict[str, float]]:
    """`num_groups` prompt groups for `step` and their metrics: one round, or dynamic sampling."""
    grpo = ctx.cfg.grpo

    def draw(round_index: int, num_prompts: int) -> RolloutGroups:
        return rollout_round(ctx, step, round_index, num_prompts)

    if not grpo.use_dynamic_sampling:
        return draw(0, num_groups), agent_metrics(ctx)
    result = dynamic_sampling(draw, num_groups, batch_multiplier=grpo.batch_multiplier,
                              max_gen_batches=grpo.dynamic_sampling_max_gen_batches)
    return result.rollouts, {**result.metrics, **agent_metrics(ctx)}


def rollout_round(ctx, step: int, round_index: int, num_prompts: int) -> RolloutGroups:
    """The next `num_prompts` prompts, rolled out and scored (one round of dynamic sampling)."""
    first = ctx.cursor.drawn
    batch = ctx.cursor.next_batch(num_prompts)
    sampling = step_sampling(ctx.cfg, step)
    if round_index and sampling.seed is not None:  # a later dynamic-sampling round of this step
        sampling = replace(sampling, seed=sampling.seed + round_index * 7919)
    return _rolled_out(ctx, batch, tuple(range(first, first + len(batch))), sampling)


def resample(ctx, step: int, stale: RolloutGroups) -> RolloutGroups:
    """The prompts of `stale` (groups too old for their step) sampled and scored again by the
    weights the generators serve now: the same draws, so no prompt is drawn outside the cursor
    (a checkpoint's cursor then resumes exactly after the prompts its steps trained)."""
    sampling = step_sampling(ctx.cfg, step)
    if sampling.seed is not None:
        sampling = replace(sampling, seed=sampling.seed + 104_729)
    return _rolled_out(ctx, list(stale.examples), stale.draws, sampling)


def _rolled_out(ctx, batch: list[Example], draws: tuple[int, ...], sampling: SamplingConfig) -> RolloutGroups:
    prompts = [list(e.prompt_ids) for e in batch]
    groups = collect_episodes(ctx, batch, prompts, sampling)
    rewards = torch.tensor([[e.reward for e in group] for group in groups], dtype=torch.float32)
    correct = torch.tensor([[e.correct for e in group] for group in groups])
    return RolloutGroups(batch, prompts, groups, rewards, correct, draws)


def step_sampling(cfg, step: int) -> SamplingConfig:
    """The step's sampling: the config's, seeded by (grpo.seed, step) so a resumed run repeats it."""
    gen = cfg.policy.generation
    return SamplingConfig(n=cfg.grpo.num_generations_per_prompt, temperature=gen.temperature, top_p=gen.top_p,
                          top_k=gen.top_k if gen.top_k is not None else -1, max_tokens=gen.max_new_tokens,
                          seed=cfg.grpo.seed * 1_000_003 + step * 100_003)


def collect_episodes(ctx, batch: list[Example], prompts: list[list[int]], sampling: SamplingConfig) -> list[list[Episode]]:
    """Roll out and score a batch that may mix tasks: single-turn tasks are generated once and
    scored (Score), multi-turn ones run episodes (Step), agent tasks run their agent through the
    rollout gateway, each run by the task's environment service (loop/gateway/agents.py); per prompt,
    its n episodes, in the batch's order. An agent
    task's prompts[i] is replaced by the prompt its episodes share (loop/gateway/agents.py)."""
    cfg = ctx.cfg

    def generate(prompt_ids: list[list[int]], params: SamplingConfig) -> list[list[Completion]]:
        return rollout.generate(prompt_ids, params, ctx.generators, ctx.services.generator_failed, ctx.log,
                                present=ctx.services.generator_present)

    rewards = ctx.rewards()
    groups: list[list[Episode]] = [[] for _ in batch]
    agents = {task for task, env in cfg.env.items() if env.served_by_agent}
    for task in sorted(agents & {e.task for e in batch}):
        indices = [i for i, e in enumerate(batch) if e.task == task]
        runner = agent_runner(ctx)
        results = runner.collect(task, cfg.env[task].agent, [batch[i] for i in indices], sampling.n,
                                 lambda e: list(e.prompt_ids), version=ctx.publisher.version)
        for i, (prompt, group) in zip(indices, results):
            prompts[i], groups[i] = prompt, group
    multi = multi_turn_tasks(cfg.env) - agents
    single = [i for i, e in enumerate(batch) if e.task not in multi and e.task not in agents]
    if single:
        completions = generate([prompts[i] for i in single], sampling)
        items = [ScoreItem(batch[i].task, batch[i].prompt, ctx.tokens.decode(c.token_ids), batch[i].answer)
                 for i, group in zip(single, completions) for c in group]
        results = iter(rewards.score(items))
        for i, group in zip(single, completions):
            groups[i] = [Episode.single_turn(batch[i].task, c, next(results)) for c in group]
    max_total_tokens = min(cfg.policy.generation.vllm_cfg.max_model_len, cfg.policy.max_total_sequence_length)
    for task in sorted(multi & {e.task for e in batch}):
        indices = [i for i, e in enumerate(batch) if e.task == task]
        episodes = run_episodes([prompts[i] for i in indices], [(task, batch[i].prompt, batch[i].answer) for i in indices],
                                sampling, generate, rewards, ctx.tokens, max_turns=cfg.env[task].max_turns,
                                max_total_tokens=max_total_tokens)
        for i, group in zip(indices, episodes):
            groups[i] = group
    return groups


def agent_runner(ctx) -> AgentRunner:
    """The run's rollout gateway and agent runner, started on first use (it stays up with the
    loop's context; the policy's samplings settings are its defaults); the agents run in the tasks'
    environment services, looked up in membership for every episode."""
    if ctx.agents is None:
        from transformers import AutoTokenizer

        cfg, gen = ctx.cfg, ctx.cfg.policy.generation

        def generate(prompt_ids: list[int], params: SamplingConfig) -> list[Completion]:
            return rollout.generate([prompt_ids], params, ctx.generators, ctx.services.generator_failed, ctx.log,
                                    present=ctx.services.generator_present)[0]

        defaults = GatewayDefaults(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_new_tokens,
                                   max_total_tokens=min(gen.vllm_cfg.max_model_len, cfg.policy.max_total_sequence_length),
                                   model=cfg.policy.model_name or "tandem-policy")
        ctx.agents = AgentRunner.start(AutoTokenizer.from_pretrained(ctx.tokens.source), generate, defaults,
                                       ctx.services.environment_clients, host=cfg.cluster.host,
                                       on_failure=ctx.services.reward_failed, wait=ctx.pause, log=ctx.log)
    return ctx.agents


def agent_metrics(ctx) -> dict[str, float]:
    """The agent tasks' counts since the last step (none without agent tasks)."""
    agents = getattr(ctx, "agents", None)  # test doubles of the context may have none
    return agents.drain_metrics() if agents is not None else {}


# ---------------------------------------------------------------------- dynamic sampling (DAPO)

class DynamicSamplingExhausted(RuntimeError):
    """The generation-round cap was hit before the batch had enough groups with reward variance."""


@dataclass(frozen=True)
class DynamicSamplingResult:
    rollouts: RolloutGroups
    metrics: dict[str, float]


def nonzero_variance(rewards_PG: torch.Tensor) -> torch.Tensor:
    """(P,) bool: the groups whose rewards are not all equal."""
    return (rewards_PG.max(dim=1).values - rewards_PG.min(dim=1).values) > 0


def dynamic_sampling(draw: Callable[[int, int], RolloutGroups], num_prompts: int, *, batch_multiplier: float,
                     max_gen_batches: int) -> DynamicSamplingResult:
    """Draw rounds of ceil(batch_multiplier x num_prompts) prompt groups (`draw(round, size)`)
    and keep those with reward variance until num_prompts are kept; extra kept groups are
    discarded. Raises DynamicSamplingExhausted after max_gen_batches rounds."""
    per_round = math.ceil(batch_multiplier * num_prompts)
    kept: list[RolloutGroups] = []
    num_kept = num_zero_variance = 0
    for round_index in range(max_gen_batches):
        part = draw(round_index, per_round)
        keep = nonzero_variance(part.rewards_PG)
        num_zero_variance += int((~keep).sum())
        kept.append(part.drop(torch.nonzero(~keep).flatten().tolist(), DropReason.ZERO_VARIANCE))
        num_kept += int(keep.sum())
        if num_kept >= num_prompts:
            merged = RolloutGroups.concat(kept)
            rollouts = merged.drop(range(num_prompts, len(merged.groups)), DropReason.SURPLUS)
            return DynamicSamplingResult(rollouts, {
                "dynamic_sampling_num_gen_batches": float(round_index + 1),
                "dynamic_sampling_num_discarded_valid_samples": float((num_kept - num_prompts) * merged.num_generations),
                "dynamic_sampling_num_zero_variance_groups": float(num_zero_variance),
                "filtered_reward": float(rollouts.rewards_PG.mean()),
            })
    raise DynamicSamplingExhausted(
        f"dynamic sampling kept {num_kept} of the {num_prompts} prompt groups it needs (rewards not all equal) after "
        f"{max_gen_batches} generation rounds of {per_round} prompts; raise grpo.dynamic_sampling_max_gen_batches or "
        "grpo.batch_multiplier, use more generations per prompt, or use prompts the model solves sometimes but not always")
