"""`data.*`: which prompts the run trains and validates on, and which keys its rows use."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from coordinator.config.section import Section


class DataConfig(Section):
    dataset_name: Literal["arithmetic", "arithmetic_preference", "jsonl"] = "arithmetic"
    """`arithmetic`: the embedded synthetic task; `arithmetic_preference`: its embedded toy preference
    pairs (dpo/rm); `jsonl`: train_path / val_path files (prompt/answer rows, or prompt/chosen/rejected)."""
    train_path: str | None = None
    """JSONL file of training rows (dataset_name jsonl)."""
    val_path: str | None = None
    """JSONL file of held-out rows (dataset_name jsonl); none: no validation."""
    prompt_key: str = "prompt"
    """Key of a row's prompt."""
    answer_key: str = "answer"
    """Key of a row's ground truth (what the reward service compares the completion with)."""
    chosen_key: str = "chosen"
    """Preference rows (dpo/rm): the preferred response."""
    rejected_key: str = "rejected"
    """Preference rows (dpo/rm): the dispreferred response."""
    task_key: str = "task"
    """Key of a row's task (the env.<task> whose reward service scores it)."""
    default_task: str = "arithmetic"
    """The task of rows that name none."""
    num_train: int = Field(6000, gt=0)
    """Training problems of the embedded task."""
    num_val: int = Field(500, gt=0)
    """Held-out problems of the embedded task (the rest of the 8,100 sums are for training)."""
    seed: int = 0
    """Seed of the embedded task's split."""
    max_truncated_fraction: float = Field(0.5, ge=0, le=1)
    """Largest fraction of the prompts whose prompt + max_new_tokens may exceed
    policy.max_total_sequence_length; past it the run refuses to start (below it: a warning)."""

    @model_validator(mode="after")
    def _paths_for_jsonl(self) -> DataConfig:
        if self.dataset_name == "jsonl" and not self.train_path:
            raise ValueError("data.train_path is required when data.dataset_name is jsonl")
        return self
