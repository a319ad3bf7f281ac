"""A run's data, read and checked in full before anything starts: every row of the train and
val files (coordinator/data/examples.py and preference.py say what a row must hold), and the
token length of every prompt against what the generators take and what the trainer is set to
take. Problems are ConfigErrors naming the key, the file (and line) and what to change; prompts
that overflow policy.max_total_sequence_length are a warning, and an error past
data.max_truncated_fraction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.config import ConfigError, ExperimentConfig
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


@dataclass(frozen=True)
class LengthReport:
    """Prompts of one file measured against the run's limits."""

    source: str
    num_prompts: int
    refused: list[tuple[str, int]]
    """(prompt, tokens) of prompts the generators would refuse: prompt + max_new_tokens > their limit."""
    overflowing: int
    """Prompts whose prompt + max_new_tokens exceeds policy.max_total_sequence_length."""
    longest: int


def measure_prompts(cfg: ExperimentConfig, examples: Sequence[Example], source: str) -> LengthReport:
    generation = cfg.policy.generation
    budget = generation.max_new_tokens
    hard, _ = cfg.policy.generation_limit
    refused, overflowing, longest = [], 0, 0
    for example in examples:
        length = len(example.prompt_ids)
        longest = max(longest, length)
        if length + budget > hard:
            refused.append((example.prompt, length))
        if length + budget > cfg.policy.max_total_sequence_length:
            overflowing += 1
    return LengthReport(source, len(examples), refused, overflowing, longest)


def check_lengths(cfg: ExperimentConfig, report: LengthReport) -> str | None:
    """ConfigError for prompts the generators would refuse, or too many past
    policy.max_total_sequence_length; the warning to show for fewer (None: all fit)."""
    generation = cfg.policy.generation
    budget = generation.max_new_tokens
    if report.refused:
        _, limit_key = cfg.policy.generation_limit
        prompt, length = report.refused[0]
        raise ConfigError(f"{report.source}: {len(report.refused)} of {report.num_prompts} prompts are too long for "
                          f"the generators: prompt + policy.generation.max_new_tokens ({budget}) exceeds {limit_key}; "
                          f"e.g. {prompt[:60]!r} has {length} tokens. Raise {limit_key} (to at least "
                          f"{report.longest + budget}), lower max_new_tokens, or drop the long rows")
    if not report.overflowing:
        return None
    fraction = report.overflowing / report.num_prompts
    limit = cfg.policy.max_total_sequence_length
    message = (f"{report.source}: {report.overflowing} of {report.num_prompts} prompts ({fraction:.0%}) plus "
               f"policy.generation.max_new_tokens ({budget}) exceed policy.max_total_sequence_length ({limit}), the "
               "longest prompt + completion the trainer is set to take (a multi-turn episode ends where its next "
               "turn would pass it). Raise "
               f"policy.max_total_sequence_length to at least {report.longest + budget}")
    if fraction > cfg.data.max_truncated_fraction:
        raise ConfigError(f"{message} (more than data.max_truncated_fraction={cfg.data.max_truncated_fraction} of "
                          "the prompts: the run would not start)")
    return message
