"""Held-out evaluation (the run's validation): greedy completions of the validation prompts, scored by the
reward services; agent tasks run one episode each in their environment services, through the rollout
gateway, greedy where the agent leaves temperature unset (loop/gateway/agents.py). Accuracy is the fraction judged correct."""

from __future__ import annotations

from coordinator.data.examples import Example
from coordinator.loop import rollout
from reward_svc.types import ScoreItem
from tandem.generation.types import SamplingConfig


def validate(ctx, examples: list[Example], max_new_tokens: int, samples: list[dict] | None = None) -> dict[str, float]:
    """ctx: the run's coordinator.loop.context.LoopContext. `samples`, if given, receives one
    row per example (task, prompt, completion, answer, reward, correct), in order."""
    from coordinator.loop.rollouts import agent_runner

    agents = {t for t, env in ctx.cfg.env.items() if env.served_by_agent}
    rows: list[tuple[str, float, bool] | None] = [None] * len(examples)
    for task in sorted(agents & {e.task for e in examples}):
        indices = [i for i, e in enumerate(examples) if e.task == task]
        outcomes = agent_runner(ctx).evaluate(task, ctx.cfg.env[task].agent, [examples[i] for i in indices])
        for i, o in zip(indices, outcomes):
            rows[i] = (f"<agent episode: {len(o.record.turns)} model calls>", o.reward if o.reason is None else 0.0,
                       o.correct and o.reason is None)
    scored = [i for i, row in enumerate(rows) if row is None]
    if scored:
        tokens = ctx.tokens
        greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=max_new_tokens, seed=0)
        groups = rollout.generate([list(examples[i].prompt_ids) for i in scored], greedy, ctx.generators,
                                  ctx.services.generator_failed, ctx.log, present=ctx.services.generator_present)
        texts = [tokens.decode(group[0].token_ids) for group in groups]
        items = [ScoreItem(examples[i].task, examples[i].prompt, text, examples[i].answer) for i, text in zip(scored, texts)]
        for i, text, r in zip(scored, texts, ctx.rewards().score(items)):
            rows[i] = (text, r.reward, bool(r.correct))
    if samples is not None:
        samples.extend({"task": e.task, "prompt": e.prompt, "completion": text, "answer": e.answer,
                        "reward": reward, "correct": correct} for e, (text, reward, correct) in zip(examples, rows))
    correct = sum(row[2] for row in rows)
    return {"accuracy": correct / len(rows), "reward_mean": sum(row[1] for row in rows) / len(rows),
            "num_samples": float(len(rows))}
