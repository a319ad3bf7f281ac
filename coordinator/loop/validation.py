"""Held-out validation: greedy completions of the validation prompts, scored by the
reward services; accuracy is the fraction judged correct."""

from __future__ import annotations

from coordinator.data.examples import Example
from coordinator.loop import rollout
from reward_svc.types import ScoreItem
from tandem.generation.types import SamplingConfig


def validate(ctx, examples: list[Example], max_new_tokens: int) -> dict[str, float]:
    """ctx: the run's coordinator.loop.context.LoopContext."""
    tokens = ctx.tokens
    prompts = [list(e.prompt_ids) for e in examples]
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=max_new_tokens, seed=0)
    groups = rollout.generate(prompts, greedy, ctx.generators, ctx.services.generator_failed, ctx.log,
                              present=ctx.services.generator_present)
    texts = [tokens.decode(group[0].token_ids) for group in groups]
    items = [ScoreItem(e.task, e.prompt, text, e.answer) for e, text in zip(examples, texts)]
    results = ctx.rewards().score(items)
    correct = sum(r.correct for r in results)
    return {"accuracy": correct / len(results), "reward_mean": sum(r.reward for r in results) / len(results),
            "num_samples": float(len(results))}
