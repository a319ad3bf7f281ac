"""Prompt datasets: examples read from JSONL files, and a reproducible cursor over them (part of
the loop checkpoint)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.config.data import DataConfig


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    task: str


def jsonl_rows(path: Path, keys: Sequence[str], hint: str) -> Iterator[dict]:
    """The JSON objects of a JSONL file (blank lines skipped); ValueError naming the file and
    line for a line that is not JSON or lacks one of `keys` (`hint` says which settings name them)."""
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
            missing = [k for k in keys if not isinstance(row, dict) or k not in row]
            if missing:
                raise ValueError(f"{path}:{line_no}: missing keys {missing} ({hint})")
            yield row


def read_jsonl(path: Path, cfg: DataConfig) -> list[Example]:
    examples = [Example(str(row[cfg.prompt_key]), str(row[cfg.answer_key]),
                        str(row.get(cfg.task_key, cfg.default_task)))
                for row in jsonl_rows(path, (cfg.prompt_key, cfg.answer_key), "see data.prompt_key / data.answer_key")]
    if not examples:
        raise ValueError(f"{path} holds no examples")
    return examples


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

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._shuffled(self.epoch)
