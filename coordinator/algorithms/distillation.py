"""On-policy distillation (`distillation.*`, coordinator/config/distillation.py): GRPO's step
(coordinator/algorithms/grpo.py) with one more phase between the samples and the trainer.

    rollouts  = the student's samples, scored by the task's rewards     as in GRPO
    samples   = advantages from the rewards, loss masks                 as in GRPO
    teacher   = the teacher's logprob of every sampled token            teacher_scored (loop/teacher.py)
    train     = the distillation loss: per-token advantage               trainer_svc/losses/distillation.py
                task_reward_coef * A - kl_penalty_coef * (student - teacher logprob)

The step's metrics add the student's reverse KL to the teacher on its own samples, before the
update (teacher_reverse_kl: the token mean of generation - teacher logprob, the sampled-token
estimate), and with distillation.teacher.top_logprobs_k how often the sampled token is among
the teacher's top k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from coordinator.loop.context import LoopContext
from coordinator.loop.teacher import score_with_teachers
from tandem.generation.types import ScoredSequence, SequenceScores
from trainer_svc.types import Sample


def teacher_scored(ctx: LoopContext, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
    """`samples` with their teacher logprobs, and the teacher's metrics of them."""
    distillation = ctx.cfg.distillation
    assert distillation is not None, "teacher_scored runs in distillation runs only"
    top_k = distillation.teacher.top_logprobs_k
    scores = score_with_teachers([ScoredSequence(tuple(s.token_ids), s.prompt_length) for s in samples],
                                 ctx.services.teachers, ctx.services.generator_failed, ctx.log, top_k=top_k)
    scored = [replace(s, teacher_logprobs=score.logprobs) for s, score in zip(samples, scores)]
    return scored, teacher_metrics(scored, scores, top_k)


def teacher_metrics(samples: Sequence[Sample], scores: Sequence[SequenceScores], top_k: int = 0) -> dict[str, float]:
    """Token means over the trained tokens (loss mask > 0): teacher_reverse_kl (generation -
    teacher logprob), teacher_logprob_mean and, with top_k, teacher_top_k_agreement (the sampled
    token is among the teacher's top k)."""
    kl = teacher = agree = 0.0
    count = 0
    for sample, score in zip(samples, scores):
        completion = sample.token_ids[sample.prompt_length:]
        mask = sample.loss_mask or [1.0] * len(completion)
        for k, (token, gen, lp, m) in enumerate(zip(completion, sample.generation_logprobs, score.logprobs, mask)):
            if m <= 0:
                continue
            count += 1
            kl += gen - lp
            teacher += lp
            if top_k:
                agree += any(t == token for t, _ in score.top[k])
    count = max(count, 1)
    metrics = {"teacher_reverse_kl": kl / count, "teacher_logprob_mean": teacher / count}
    if top_k:
        metrics["teacher_top_k_agreement"] = agree / count
    return metrics
