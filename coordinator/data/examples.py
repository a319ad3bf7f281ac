"""Prompt datasets: examples read from JSONL files (or, with data.dataset_name local, from any
file the `datasets` library reads), their prompts rendered and tokenized once
(coordinator/data/prompts.py), and a reproducible cursor over them (part of the loop checkpoint)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.config.data import DataConfig
from coordinator.data.tokens import Tokens

LOCAL_FILE_TYPES = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}
"""dataset_name local: the `datasets` builder of a file, by its suffix."""


@dataclass(frozen=True)
class Example:
    prompt: str
    """The text the policy sees (rendered: chat template, prompt file), as reward services get it."""
    answer: str
    task: str
    prompt_ids: tuple[int, ...]
    """The prompt's token ids, as generators and the trainer get them."""


def jsonl_rows(path: Path, keys: Sequence[str], hint: str) -> Iterator[dict]:
    """The JSON objects of a JSONL file (blank lines skipped); ValueError naming the file (and
    line) for a path that is not a readable UTF-8 file, a line that is not a JSON object, or a row
    that lacks one of `keys` (`hint` says which settings name them)."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a JSONL file")
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a leading byte-order mark is not part of row 1
            yield from _rows(path, f, keys, hint)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason}, byte {exc.object[exc.start:exc.start + 1]!r}): "
                         "give a JSONL file, one JSON object a line") from None


def _rows(path: Path, lines, keys: Sequence[str], hint: str) -> Iterator[dict]:
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
        yield row


def read_examples(path: Path, data: DataConfig, tokens: Tokens, *, split: str | None = None) -> list[Example]:
    """The examples of a train or held-out file (`split`: the split of a local dataset holding
    several; default data.train_split). ValueError naming the file and row for a bad row."""
    from coordinator.data.prompts import prompt_format

    fmt = prompt_format(data, tokens)
    rows = (local_rows(Path(path), split or data.train_split) if data.dataset_name == "local"
            else jsonl_rows(Path(path), (), ""))
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
    rows = local_rows(Path(path), split) if data.dataset_name == "local" else jsonl_rows(Path(path), (), "")
    return {str(row.get(data.task_key) or data.default_task) for row in rows}


def local_rows(path: Path, split: str) -> list[dict]:
    """The rows of a local dataset: a file of a LOCAL_FILE_TYPES type, a directory of such files,
    or one written by `save_to_disk`; `split` picks one of several splits."""
    import datasets

    from coordinator.embedded.cache import cache_root

    datasets.disable_progress_bars()
    cache = str(cache_root() / "datasets")
    if not path.exists():
        raise ValueError(f"{path} does not exist (data.train_path / data.val_path)")
    if path.is_dir() and any((path / name).is_file() for name in ("state.json", "dataset_dict.json")):
        loaded = datasets.load_from_disk(str(path))
    elif path.is_dir():
        loaded = datasets.load_dataset(str(path), cache_dir=cache)
    elif path.suffix in LOCAL_FILE_TYPES:
        loaded = datasets.load_dataset(LOCAL_FILE_TYPES[path.suffix], data_files=str(path), split="train",
                                       cache_dir=cache)
    else:
        raise ValueError(f"{path}: data.dataset_name local reads {sorted(LOCAL_FILE_TYPES)} files or a dataset "
                         "directory")
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{path} has the splits {sorted(loaded)}, not {split!r}: set data.train_split / "
                             "data.val_split")
        loaded = loaded[split]
    return loaded.to_list()


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
