"""Where a run's rows come from (`data.dataset_name`), as one object chosen at load: each source
knows how to prepare its files (building and caching the embedded ones) and how to read their
rows, so nothing downstream branches on the dataset's name.

    train, val = data_source(cfg.data).files(cfg.data)
    rows = data_source(cfg.data).rows(train, cfg.data.train_split)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.config.data import DataConfig, DatasetName
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.cache import cache_root
from coordinator.embedded.preference import ensure_preference_dataset

LOCAL_FILE_TYPES = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}
"""dataset_name local: the `datasets` builder of a file, by its suffix."""


@dataclass(frozen=True)
class EmbeddedSource:
    """Data built here once and cached (JSONL files under the cache's datasets/)."""

    ensure: Callable[[Path, int, int, int], tuple[Path, Path]]
    uniform_prompts: bool = False
    """Every prompt is one of the embedded arithmetic task's, whose longest one is known without
    reading the files (under the embedded tokenizer)."""

    def files(self, data: DataConfig) -> tuple[Path, Path | None]:
        return self.ensure(cache_root(), data.seed, data.num_train, data.num_val)

    def rows(self, path: Path, split: str) -> Iterable[dict]:
        return jsonl_rows(path, (), "")


@dataclass(frozen=True)
class UserFiles:
    """data.train_path / data.val_path, read by `read` (JSONL, or any file the `datasets` library reads)."""

    read: Callable[[Path, str], Iterable[dict]]
    uniform_prompts: bool = False

    def files(self, data: DataConfig) -> tuple[Path, Path | None]:
        return Path(data.train_path), Path(data.val_path) if data.val_path else None

    def rows(self, path: Path, split: str) -> Iterable[dict]:
        """The file's rows (`split`: the split of a dataset holding several; a JSONL file has one)."""
        return self.read(path, split)


DataSource = EmbeddedSource | UserFiles


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


def local_rows(path: Path, split: str) -> list[dict]:
    """The rows of a local dataset: a file of a LOCAL_FILE_TYPES type, a directory of such files,
    or one written by `save_to_disk`; `split` picks one of several splits."""
    import datasets

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


SOURCES: dict[DatasetName, DataSource] = {
    DatasetName.ARITHMETIC: EmbeddedSource(ensure_arithmetic_dataset, uniform_prompts=True),
    DatasetName.ARITHMETIC_PREFERENCE: EmbeddedSource(ensure_preference_dataset),
    DatasetName.JSONL: UserFiles(lambda path, split: jsonl_rows(path, (), "")),
    DatasetName.LOCAL: UserFiles(local_rows),
}


def data_source(data: DataConfig) -> DataSource:
    """The run's data source, by data.dataset_name."""
    return SOURCES[data.dataset_name]
