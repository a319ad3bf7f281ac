"""A run's model directory and data files: the ones the config names, or the embedded tiny model
and task built (once) into the cache."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import ExperimentConfig
from coordinator.data.sources import data_source
from coordinator.embedded.cache import cache_root


def prepare_model(cfg: ExperimentConfig) -> str:
    """policy.model_name, or the embedded tiny model's directory (built if missing)."""
    if cfg.policy.model_name is not None:
        return cfg.policy.model_name
    from coordinator.embedded.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model(cache_root()))


def prepare_data(cfg: ExperimentConfig) -> tuple[Path, Path | None]:
    """The train and val files (the data source builds the embedded ones if asked: the arithmetic
    task, or its toy preference pairs for DPO/RM)."""
    return data_source(cfg.data).files(cfg.data)


def prepare_inputs(cfg: ExperimentConfig) -> tuple[str, Path, Path | None]:
    """The model directory and the train/val files (see prepare_model, prepare_data)."""
    return prepare_model(cfg), *prepare_data(cfg)
