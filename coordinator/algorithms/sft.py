"""SFT: supervised steps on prompt -> answer pairs (the GRPO warm start), through the
same trainer service. One call trains `num_steps` optimizer steps of `global_batch_size`
samples each, so a long warm start costs few round trips."""

from __future__ import annotations

from coordinator.loop.context import LoopContext
from trainer_svc.types import NllLossConfig, Sample


def sft_steps(ctx: LoopContext, num_steps: int) -> dict[str, float]:
    cfg = ctx.cfg.sft
    ctx.release_generators()  # generators sharing its memory sleep until the next publish
    batch = ctx.cursor.next_batch(cfg.global_batch_size * num_steps)
    samples = []
    for example in batch:
        prompt = list(example.prompt_ids)
        samples.append(Sample(token_ids=prompt + ctx.tokens.answer(example.answer), prompt_length=len(prompt)))
    result = ctx.services.trainer.train_step(samples, NllLossConfig(), global_batch_size=cfg.global_batch_size,
                                             micro_batch_size=cfg.micro_batch_size, learning_rate=cfg.lr)
    return result.metrics
