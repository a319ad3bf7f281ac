"""Distillation's step pieces by hand: the teacher's metrics of the samples
(coordinator/algorithms/distillation.py), the loss the step trains with, and vLLM's prompt
logprobs mapped to a teacher's scores (generator_svc/engines/vllm_outputs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from coordinator.algorithms.distillation import teacher_metrics
from coordinator.algorithms.grpo import trainer_loss
from coordinator.config import ExperimentConfig
from generator_svc.engines.vllm_outputs import sequence_scores
from tandem.generation.types import SequenceScores
from trainer_svc.types import DistillationLossConfig, GrpoLossConfig, Sample


def test_teacher_metrics_are_token_means_over_trained_tokens():
    samples = [Sample((1, 5, 6), 1, generation_logprobs=(-1.0, -2.0)),
               Sample((1, 7, 8), 1, loss_mask=(1.0, 0.0), generation_logprobs=(-0.5, -9.0))]
    scores = [SequenceScores((-0.5, -3.0), top=(((5, -0.5), (9, -1.0)), ((4, -0.1), (3, -2.0)))),
              SequenceScores((-1.5, -0.1), top=(((2, -0.2), (7, -1.5)), ((8, -0.1), (1, -3.0))))]
    metrics = teacher_metrics(samples, scores, top_k=2)
    # trained tokens: (-1 vs -0.5), (-2 vs -3), (-0.5 vs -1.5); sample 2's second token is masked out
    assert metrics["teacher_reverse_kl"] == pytest.approx((-0.5 + 1.0 + 1.0) / 3)
    assert metrics["teacher_logprob_mean"] == pytest.approx((-0.5 - 3.0 - 1.5) / 3)
    assert metrics["teacher_top_k_agreement"] == pytest.approx(2 / 3)  # 5 and 7 are in their top 2, 6 is not
    assert "teacher_top_k_agreement" not in teacher_metrics(samples, scores)


def test_the_step_trains_with_distillations_loss_only_in_distillation_runs(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    distill = ExperimentConfig(distillation={"teacher": {"model_name": str(tmp_path)}, "kl_penalty_coef": 0.5,
                                             "task_reward_coef": 0.25})
    loss = trainer_loss(SimpleNamespace(cfg=distill))
    assert loss == DistillationLossConfig(kl_penalty_coef=0.5, task_reward_coef=0.25)
    assert type(trainer_loss(SimpleNamespace(cfg=ExperimentConfig()))) is GrpoLossConfig


def _logprob(value: float, rank: int):
    return SimpleNamespace(logprob=value, rank=rank)


def test_prompt_logprobs_become_the_completions_scores_and_top_k():
    tokens = [1, 10, 11, 12]  # prompt [1, 10], completion [11, 12]
    prompt_logprobs = [None, {10: _logprob(-3.0, 5)},
                       {11: _logprob(-2.0, 3), 4: _logprob(-0.1, 1), 9: _logprob(-1.0, 2)},
                       {12: _logprob(-0.2, 1), 7: _logprob(-2.5, 2)}]
    scores = sequence_scores(tokens, 2, prompt_logprobs, top_k=2)
    assert scores.logprobs == (-2.0, -0.2)
    assert scores.top == (((4, -0.1), (9, -1.0)), ((12, -0.2), (7, -2.5)))  # the sampled 11 (rank 3) is not in the top 2
    assert sequence_scores(tokens, 2, prompt_logprobs, top_k=0) == SequenceScores((-2.0, -0.2))
    with pytest.raises(AssertionError, match="3 prompt logprob entries for a 4-token"):
        sequence_scores(tokens, 2, prompt_logprobs[:3], top_k=0)
