"""Plain domain types of the reward service (no protobuf here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


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
    agent_tasks: tuple[str, ...] = ()
    """The tasks whose episodes are an agent's (run with RunEpisode)."""


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


class EpisodeEnd(StrEnum):
    """How an agent's episode ended (each reason but REWARDED is counted: agent/ended_<value>)."""

    REWARDED = "rewarded"
    """The agent returned a reward."""
    TIMEOUT = "timeout"
    """It ran past its time limit (env.<task>.agent.timeout_s)."""
    ERROR = "error"
    """The agent (its own code, a tool) raised."""
    BAD_RETURN = "bad_return"
    """It returned something other than a finite number or (finite number, dict)."""
    REFUSED_CALL = "refused_call"
    """A model call of it was refused by the gateway (HTTP 4xx: a request the gateway cannot serve
    as sent, e.g. messages that do not continue the episode, or an episode out of room) and it
    did not handle the error."""
    NO_GENERATOR = "no_generator"
    """A model call of it failed because no generator could serve it (HTTP 503)."""
    JUDGE_UNPARSABLE = "judge_unparsable"
    """Its judge's reply held no score in range (reward_svc/envs/judge.py UnparsableJudgement), not handled."""
    SERVICE_LOST = "service_lost"
    """Set by the coordinator: the environment services running it died (or stopped answering) more
    times than an episode is re-run."""


@dataclass(frozen=True)
class EpisodeRequest:
    """One agent episode to run: the example, and where its model calls go (the run's rollout
    gateway, with the episode's own API key)."""

    task: str
    example: dict
    """prompt, answer, task (strings)."""
    base_url: str
    api_key: str


@dataclass(frozen=True)
class EpisodeResult:
    """The end of an agent episode: its reward (0 unless REWARDED) and how it ended."""

    end: EpisodeEnd
    reward: float = 0.0
    correct: bool = False
    turn_rewards: tuple[float, ...] = ()
    """The agent's per-turn rewards (info["turn_rewards"]), when it gave them."""
    info: dict = field(default_factory=dict)
    """The agent's info (values as JSON allows), or {"error": ...} when it did not return a reward."""
