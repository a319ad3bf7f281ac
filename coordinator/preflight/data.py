"""A run's data and tokenizer, read in full before anything starts: every row of the train and
val files (coordinator/data/examples.py and preference.py say what a row must hold). Problems
are ConfigErrors naming the key, the file (and line) and what to change.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.config import ConfigError
from coordinator.config.data import DataConfig
from coordinator.data.examples import Example, read_examples
from coordinator.data.preference import PreferencePair, read_pairs
from coordinator.data.tokens import Tokens


def load_examples(path: Path, data: DataConfig, tokens: Tokens, key: str, split: str) -> list[Example]:
    """The rows of `path` (named by config key `key`) as the run reads them, or ConfigError."""
    try:
        return read_examples(path, data, tokens, split=split)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def load_pairs(path: Path, cfg: DataConfig, key: str) -> list[PreferencePair]:
    """The preference rows of `path` (named by config key `key`), or ConfigError."""
    try:
        return read_pairs(path, cfg)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def load_tokens(model_name: str | None, model_dir: str, key: str = "policy.model_name") -> Tokens:
    """A run's tokenizer (`Tokens.of_run`: model_name None is the embedded model), or ConfigError
    saying why it does not load."""
    try:
        return Tokens.of_run(model_name, model_dir)
    except Exception as exc:  # transformers raises many kinds (OSError, ValueError, KeyError, ...)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{key}: the tokenizer in {model_dir} does not load ({type(exc).__name__}: "
                          f"{message[:300]}); copy the checkpoint's tokenizer files beside config.json") from None
