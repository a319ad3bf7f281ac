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
    multi_turn_tasks: tuple[str, ...] = ()
    """The tasks whose episodes take several turns (rolled out with Step)."""


@dataclass(frozen=True)
class Turn:
    """One finished turn of an episode: the model's completion and the environment's observation."""

    completion: str
    observation: str


@dataclass(frozen=True)
class StepItem:
    """One episode to advance by a turn: the conversation so far (prompt, earlier turns) and the
    model's latest completion, which the environment responds to."""

    task: str
    prompt: str
    ground_truth: str
    history: tuple[Turn, ...]
    completion: str


@dataclass(frozen=True)
class StepResult:
    """The environment's answer: an observation to append (done False), or the end of the
    episode (done True). reward is this turn's; an episode's return is the sum over its turns.
    correct matters when done (accuracy metrics)."""

    done: bool
    observation: str = ""
    reward: float = 0.0
    correct: bool = False
