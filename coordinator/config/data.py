"""`data.*`: which prompts the run trains and validates on, and which keys its rows use."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from coordinator.config.section import Section


class DatasetName(StrEnum):
    """Where the rows come from, chosen once at load; what each source holds is said here, how it
    is prepared and read by its object in coordinator/data/sources.py."""

    ARITHMETIC = "arithmetic"
    ARITHMETIC_PREFERENCE = "arithmetic_preference"
    JSONL = "jsonl"
    LOCAL = "local"

    @property
    def from_files(self) -> bool:
        """Rows from the user's data.train_path / data.val_path (else built here and cached)."""
        return self in (DatasetName.JSONL, DatasetName.LOCAL)

    @property
    def holds_prompts(self) -> bool:
        """May hold prompt/answer rows (what GRPO and SFT train on)."""
        return self is not DatasetName.ARITHMETIC_PREFERENCE

    @property
    def holds_pairs(self) -> bool:
        """May hold prompt/chosen/rejected pairs (what DPO and RM train on)."""
        return self in (DatasetName.ARITHMETIC_PREFERENCE, DatasetName.JSONL)


class DataConfig(Section):
    dataset_name: DatasetName = DatasetName.ARITHMETIC
    """`arithmetic`: the embedded synthetic task; `arithmetic_preference`: its embedded toy preference
    pairs (dpo/rm); `jsonl`: train_path / val_path JSONL files (prompt/answer rows, or
    prompt/chosen/rejected); `local`: train_path / val_path read with the `datasets` library
    (.parquet, .arrow, .json/.jsonl, .csv files, or a directory of them or from `save_to_disk`)."""
    train_path: str | None = None
    """File of training rows (dataset_name jsonl or local)."""
    val_path: str | None = None
    """File of held-out rows (dataset_name jsonl or local); none: no validation."""
    train_split: str = "train"
    """dataset_name local, a path holding several splits: the split to train on."""
    val_split: str = "test"
    """dataset_name local, a path holding several splits: the held-out split."""
    prompt_key: str = "prompt"
    """Key (column) of a row's prompt: a string, or a list of chat messages."""
    messages_key: str = "messages"
    """Key (column) of a row's chat messages ([{"role", "content"}, ...]), used when the row has it."""
    prompt_format: Literal["auto", "raw", "chat"] = "auto"
    """How prompts become text (coordinator/data/prompts.py): `chat` renders every prompt with the
    tokenizer's chat template (a string as a user message) and its generation prompt; `raw` uses
    strings as they are; `auto`: messages with the template, strings raw unless a system prompt is set."""
    prompt_file: str | None = None
    """A file holding a template with one {} where each row's prompt (a string) goes (NeMo-RL's key)."""
    system_prompt_file: str | None = None
    """A file holding the system prompt put before each chat prompt without one (NeMo-RL's key)."""
    answer_key: str = "answer"
    """Key (column) of a row's ground truth (what the reward service compares the completion with)."""
    chosen_key: str = "chosen"
    """Preference rows (dpo/rm): the preferred response."""
    rejected_key: str = "rejected"
    """Preference rows (dpo/rm): the dispreferred response."""
    task_key: str = "task"
    """Key of a row's task (the env.<task> whose reward service scores it)."""
    default_task: str | None = None
    """The task of rows that name none. Unset: the env's task when there is one; required with several."""
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
        if self.dataset_name.from_files and not self.train_path:
            raise ValueError(f"data.train_path is required when data.dataset_name is {self.dataset_name}")
        return self
