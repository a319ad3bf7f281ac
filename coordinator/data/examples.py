"""Prompt datasets: examples read from the run's data source's rows (coordinator/data/sources.py),
their prompts rendered and tokenized once (coordinator/data/prompts.py), and a reproducible
cursor over them (part of the loop checkpoint)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from coordinator.config.data import DataConfig
from coordinator.data.sources import data_source
from coordinator.data.tokens import Tokens


@dataclass(frozen=True)
class Example:
    prompt: str
    """The text the policy sees (rendered: chat template, prompt file), as reward services get it."""
    answer: str
    task: str
    prompt_ids: tuple[int, ...]
    """The prompt's token ids, as generators and the trainer get them."""


def read_examples(path: Path, data: DataConfig, tokens: Tokens, *, split: str | None = None) -> list[Example]:
    """The examples of a train or held-out file (`split`: the split of a local dataset holding
    several; default data.train_split). ValueError naming the file and row for a bad row."""
    from coordinator.data.prompts import prompt_format

    fmt = prompt_format(data, tokens)
    rows = data_source(data).rows(Path(path), split or data.train_split)
    examples = []
    for index, row in enumerate(rows, 1):
        prompt = row.get(data.messages_key)
        prompt = row.get(data.prompt_key) if prompt is None else prompt
        if prompt is None or row.get(data.answer_key) is None:
            raise ValueError(f"{path}: row {index} has no {data.prompt_key!r} (or {data.messages_key!r}) and "
                             f"{data.answer_key!r}; its keys: {sorted(row)} (see data.prompt_key / data.messages_key "
                             "/ data.answer_key)")
        for key in (data.answer_key, data.task_key):
            if key in row and not _scalar(row[key]):
                raise ValueError(f"{path}: row {index}: {key} must be a string, not {json.dumps(row[key])[:40]} "
                                 f"(see data.{'answer' if key == data.answer_key else 'task'}_key)")
        if not isinstance(prompt, list) and not _scalar(prompt):
            raise ValueError(f"{path}: row {index}: {data.prompt_key} must be a string or a list of chat messages, "
                             f"not {json.dumps(prompt)[:40]}")
        try:
            text, ids = fmt.render(prompt if isinstance(prompt, list) else str(prompt))
        except ValueError as exc:
            raise ValueError(f"{path}: row {index}: {exc}") from None
        examples.append(Example(text, str(row[data.answer_key]), str(row.get(data.task_key) or data.default_task),
                                tuple(ids)))
    if not examples:
        raise ValueError(f"{path} holds no examples (it is empty or holds only blank lines)")
    return examples


def _scalar(value: object) -> bool:
    """A value a row may hold as its answer or task: a string or a number (not true/false, null,
    a list or an object)."""
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def dataset_tasks(path: Path, data: DataConfig, split: str) -> set[str]:
    """The tasks a dataset's rows name (without rendering their prompts)."""
    rows = data_source(data).rows(Path(path), split)
    return {str(row.get(data.task_key) or data.default_task) for row in rows}


class PromptCursor:
    """Walks a dataset in a seeded random order, reshuffling each epoch."""

    def __init__(self, examples: list[Example], seed: int):
        self._examples = examples
        self._seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self._examples)))
        random.Random(self._seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[Example]:
        batch = []
        while len(batch) < size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            batch.append(self._examples[self._order[self.position]])
            self.position += 1
        return batch

    @property
    def drawn(self) -> int:
        """How many prompts were drawn so far (over all epochs): the next prompt's draw index, its
        id in the run's stream of prompts (coordinator/loop/ledger.py)."""
        return self.epoch * len(self._examples) + self.position

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._shuffled(self.epoch)
