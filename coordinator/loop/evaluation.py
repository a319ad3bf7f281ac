"""Held-out evaluation (the run's validation): greedy completions of the validation prompts, scored by the
reward services; accuracy is the fraction judged correct."""

from __future__ import annotations

from coordinator.data.examples import Example
from coordinator.loop import rollout
from reward_svc.types import ScoreItem
from tandem.generation.types import SamplingConfig


def validate(ctx, examples: list[Example], max_new_tokens: int, samples: list[dict] | None = None) -> dict[str, float]:
    """ctx: the run's coordinator.loop.context.LoopContext. `samples`, if given, receives one
    row per example (task, prompt, completion, answer, reward, correct), in order."""
    tokens = ctx.tokens
    prompts = [list(e.prompt_ids) for e in examples]
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=max_new_tokens, seed=0)
    groups = rollout.generate(prompts, greedy, ctx.generators, ctx.services.generator_failed, ctx.log,
                              present=ctx.services.generator_present)
    texts = [tokens.decode(group[0].token_ids) for group in groups]
    items = [ScoreItem(e.task, e.prompt, text, e.answer) for e, text in zip(examples, texts)]
    results = ctx.rewards().score(items)
    if samples is not None:
        samples.extend({"task": e.task, "prompt": e.prompt, "completion": text, "answer": e.answer,
                        "reward": r.reward, "correct": bool(r.correct)} for e, text, r in zip(examples, texts, results))
    correct = sum(r.correct for r in results)
    return {"accuracy": correct / len(results), "reward_mean": sum(r.reward for r in results) / len(results),
            "num_samples": float(len(results))}
