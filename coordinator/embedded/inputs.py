"""A run's model directory and data files: the ones the config names, or the embedded tiny model
and task built (once) into the cache."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import ExperimentConfig
from coordinator.embedded.cache import cache_root


def prepare_model(cfg: ExperimentConfig) -> str:
    """policy.model_name, or the embedded tiny model's directory (built if missing)."""
    if cfg.policy.model_name is not None:
        return cfg.policy.model_name
    from coordinator.embedded.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model(cache_root()))


def prepare_data(cfg: ExperimentConfig) -> tuple[Path, Path | None]:
    """The train and val files (building the embedded ones if asked: the arithmetic task, or its
    toy preference pairs for DPO/RM)."""
    if cfg.data.dataset_name in ("arithmetic", "arithmetic_preference"):
        from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
        from coordinator.embedded.preference import ensure_preference_dataset

        ensure = ensure_arithmetic_dataset if cfg.data.dataset_name == "arithmetic" else ensure_preference_dataset
        return ensure(cache_root(), cfg.data.seed, cfg.data.num_train, cfg.data.num_val)
    return Path(cfg.data.train_path), Path(cfg.data.val_path) if cfg.data.val_path else None


def prepare_inputs(cfg: ExperimentConfig) -> tuple[str, Path, Path | None]:
    """The model directory and the train/val files (see prepare_model, prepare_data)."""
    return prepare_model(cfg), *prepare_data(cfg)
