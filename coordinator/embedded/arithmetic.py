"""Embedded default task: synthetic two-digit addition ("12+34=" -> "46").

All 90 * 90 ordered pairs of operands in 10..99 are shuffled with a fixed seed
and cut into disjoint train and held-out splits. The policy sees BOS + prompt and
should emit the answer digits followed by EOS. ``ensure_arithmetic_dataset``
caches the splits as JSONL under ``cache_root/datasets``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterable

from coordinator.embedded.cache import ensure_entry, short_hash

TASK_NAME = "arithmetic"
OPERAND_RANGE = range(10, 100)
NUM_PROBLEMS = len(OPERAND_RANGE) ** 2
DEFAULT_NUM_VAL = 500
DATASET_FORMAT = 1  # bump when the row layout changes so old cache entries are not reused


def make_problem(a: int, b: int) -> dict[str, str]:
    """One task row for ``a + b``."""
    return {"prompt": f"{a}+{b}=", "answer": str(a + b), "task": TASK_NAME}


def all_operand_pairs() -> list[tuple[int, int]]:
    """Every ordered operand pair, in a fixed canonical order."""
    return [(a, b) for a in OPERAND_RANGE for b in OPERAND_RANGE]


def make_arithmetic_splits(
    seed: int, num_train: int, num_val: int
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Deterministic disjoint (train, val) splits of the addition problems."""
    if num_train < 0 or num_val < 0 or num_train + num_val > NUM_PROBLEMS:
        raise ValueError(f"need 0 <= num_train + num_val <= {NUM_PROBLEMS}, got {num_train} + {num_val}")
    pairs = all_operand_pairs()
    random.Random(seed).shuffle(pairs)
    val = [make_problem(a, b) for a, b in pairs[:num_val]]
    train = [make_problem(a, b) for a, b in pairs[num_val : num_val + num_train]]
    return train, val


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    """Write one JSON object per line."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    """Read the rows written by ``write_jsonl``."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def arithmetic_dataset_dir(cache_root: Path, seed: int, num_train: int, num_val: int) -> Path:
    """Where ``ensure_arithmetic_dataset`` keeps these splits."""
    key = short_hash({"seed": seed, "train": num_train, "val": num_val, "format": DATASET_FORMAT})
    return Path(cache_root) / "datasets" / f"arithmetic-{key}"


def ensure_arithmetic_dataset(
    cache_root: Path, seed: int, num_train: int | None = None, num_val: int = DEFAULT_NUM_VAL
) -> tuple[Path, Path]:
    """Write the splits once under ``cache_root/datasets``; return (train.jsonl, val.jsonl).

    ``num_train`` defaults to every problem not held out.
    """
    if num_train is None:
        num_train = NUM_PROBLEMS - num_val

    def build(tmp: Path) -> None:
        train, val = make_arithmetic_splits(seed, num_train, num_val)
        write_jsonl(tmp / "train.jsonl", train)
        write_jsonl(tmp / "val.jsonl", val)

    entry = ensure_entry(arithmetic_dataset_dir(cache_root, seed, num_train, num_val), build)
    return entry / "train.jsonl", entry / "val.jsonl"


def exact_match(completion: str, answer: str) -> float:
    """1.0 when the completion is exactly the answer (surrounding whitespace ignored)."""
    return 1.0 if completion.strip() == answer else 0.0
