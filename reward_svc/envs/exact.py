"""Exact-answer scorer for the embedded arithmetic task: the completion's first line,
stripped, must equal the reference answer."""

from __future__ import annotations

from reward_svc.types import ScoreResult


def score(completion: str, ground_truth: str) -> ScoreResult:
    lines = completion.strip().splitlines()
    answer = lines[0].strip() if lines else ""
    correct = answer == ground_truth.strip()
    return ScoreResult(reward=1.0 if correct else 0.0, correct=correct)
