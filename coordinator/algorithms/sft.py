"""SFT: supervised steps on prompt -> answer pairs (the GRPO warm start), through the
same trainer service; no generator is needed until the weights are published."""

from __future__ import annotations

from coordinator.algorithms.context import LoopContext
from trainer_svc.types import NllLossConfig, Sample


def sft_step(ctx: LoopContext) -> dict[str, float]:
    cfg = ctx.cfg.sft
    batch = ctx.cursor.next_batch(cfg.global_batch_size)
    samples = []
    for example in batch:
        prompt = ctx.tokens.prompt(example.prompt)
        samples.append(Sample(token_ids=prompt + ctx.tokens.answer(example.answer), prompt_length=len(prompt)))
    result = ctx.services.trainer.train_step(samples, NllLossConfig(), global_batch_size=cfg.global_batch_size,
                                             micro_batch_size=cfg.micro_batch_size, learning_rate=cfg.lr)
    return result.metrics
