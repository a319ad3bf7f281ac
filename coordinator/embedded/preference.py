"""Embedded toy preference pairs for DPO and reward-model training, built locally.

Each pair shares an addition prompt of the embedded task ("12+34="): the chosen response is
its answer ("46"), the rejected one a string of lowercase letters of the same length ("qk").
The preference (digits over letters) is visible in a few characters, so both a tiny policy
under DPO and a tiny reward model learn it, and generalise it to held-out prompts, in a few
optimizer steps. Splits follow the arithmetic task's held-out problems, cached as JSONL under
``cache_root/datasets``.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from coordinator.embedded.arithmetic import make_arithmetic_splits, write_jsonl
from coordinator.embedded.cache import ensure_entry, short_hash

TASK_NAME = "arithmetic_preference"
DATASET_FORMAT = 1  # bump when the row layout changes so old cache entries are not reused


def make_pair(problem: dict[str, str], rng: random.Random) -> dict[str, str]:
    """One preference row from an arithmetic problem: the answer beats letters of its length."""
    answer = problem["answer"]
    rejected = "".join(rng.choice(string.ascii_lowercase) for _ in answer)
    return {"prompt": problem["prompt"], "chosen": answer, "rejected": rejected}


def make_preference_splits(seed: int, num_train: int, num_val: int) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, val) pairs over disjoint prompts."""
    train, val = make_arithmetic_splits(seed, num_train, num_val)
    rng = random.Random(seed)
    return [make_pair(p, rng) for p in train], [make_pair(p, rng) for p in val]


def preference_dataset_dir(cache_root: Path, seed: int, num_train: int, num_val: int) -> Path:
    key = short_hash({"seed": seed, "train": num_train, "val": num_val, "format": DATASET_FORMAT})
    return Path(cache_root) / "datasets" / f"{TASK_NAME}-{key}"


def ensure_preference_dataset(cache_root: Path, seed: int, num_train: int, num_val: int) -> tuple[Path, Path]:
    """Write the splits once under ``cache_root/datasets``; return (train.jsonl, val.jsonl)."""
    def build(tmp: Path) -> None:
        train, val = make_preference_splits(seed, num_train, num_val)
        write_jsonl(tmp / "train.jsonl", train)
        write_jsonl(tmp / "val.jsonl", val)

    entry = ensure_entry(preference_dataset_dir(cache_root, seed, num_train, num_val), build)
    return entry / "train.jsonl", entry / "val.jsonl"
