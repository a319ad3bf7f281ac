"""Preference pairs (DPO, reward models): prompt, chosen and rejected responses from JSONL rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coordinator.config.data import DataConfig
from coordinator.data.sources import jsonl_rows


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def read_pairs(path: Path, cfg: DataConfig) -> list[PreferencePair]:
    """Rows with data.prompt_key / chosen_key / rejected_key; ValueError naming the line."""
    keys = (cfg.prompt_key, cfg.chosen_key, cfg.rejected_key)
    hint = "a preference row; see data.prompt_key / data.chosen_key / data.rejected_key"
    pairs = [PreferencePair(*(str(row[k]) for k in keys)) for row in jsonl_rows(path, keys, hint)]
    if not pairs:
        raise ValueError(f"{path} holds no preference pairs")
    return pairs
