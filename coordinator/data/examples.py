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


def jsonl_rows(path: Path, keys: Sequence[str], hint: str, optional: Sequence[str] = ()) -> Iterator[dict]:
    """The JSON objects of a JSONL file (blank lines skipped); ValueError naming the file (and
    line) for a path that is not a readable UTF-8 file, a line that is not a JSON object, or a row
    that lacks one of `keys`, or holds something other than a string or number under one of
    `keys` or `optional` (`hint` says which settings name them)."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a JSONL file")
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a leading byte-order mark is not part of row 1
            yield from _rows(path, f, keys, optional, hint)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason}, byte {exc.object[exc.start:exc.start + 1]!r}): "
                         "give a JSONL file, one JSON object a line") from None


def _rows(path: Path, lines, keys: Sequence[str], optional: Sequence[str], hint: str) -> Iterator[dict]:
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{line_no}: a row must be a JSON object ({{...}}), not {type(row).__name__} "
                             f"{line.strip()[:40]!r}")
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"{path}:{line_no}: missing keys {missing} ({hint})")
        wrong = [k for k in (*keys, *(k for k in optional if k in row))
                 if not isinstance(row[k], str | int | float) or isinstance(row[k], bool)]
        if wrong:
            raise ValueError(f"{path}:{line_no}: {wrong[0]} must be a string, not {json.dumps(row[wrong[0]])[:40]} "
                             f"({hint})")
        yield row


def read_jsonl(path: Path, cfg: DataConfig) -> list[Example]:
    hint = "see data.prompt_key / data.answer_key / data.task_key"
    examples = [Example(str(row[cfg.prompt_key]), str(row[cfg.answer_key]), str(row.get(cfg.task_key, cfg.default_task)))
                for row in jsonl_rows(path, (cfg.prompt_key, cfg.answer_key), hint, optional=(cfg.task_key,))]
    if not examples:
        raise ValueError(f"{path} holds no examples (it is empty or holds only blank lines)")
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
