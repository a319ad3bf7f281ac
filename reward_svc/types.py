"""Plain domain types of the reward service (no protobuf here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreItem:
    """One completion to score for `task` against `ground_truth`."""

    task: str
    prompt: str
    completion: str
    ground_truth: str


@dataclass(frozen=True)
class ScoreResult:
    """A scalar reward and whether the answer counts as correct (for accuracy metrics)."""

    reward: float
    correct: bool


@dataclass(frozen=True)
class RewardInfo:
    tasks: tuple[str, ...]
    scorers: dict[str, str]
