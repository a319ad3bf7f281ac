"""Settings of one reward service process (its section of the experiment config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ScorerName = Literal["exact", "math"]


class RewardSettings(BaseModel):
    """Which scorer serves which task, and how scoring runs."""

    model_config = ConfigDict(extra="forbid")

    tasks: dict[str, ScorerName] = Field(default_factory=lambda: {"arithmetic": "exact"})
    """Task name -> scorer. `exact`: the completion's first line equals the answer;
    `math`: math-verify equivalence (boxed, plain numbers, LaTeX)."""
    num_workers: int = Field(1, ge=1)
    """Worker processes that run the scorers (never the gRPC thread)."""
    item_timeout_s: float = Field(5.0, gt=0)
    """Per-item scoring time limit; an item over it scores 0."""
