"""Everything a run reads, read and checked before it creates its directory or starts a service:
the paths it will write and the memory it will reserve (coordinator/config/checks.py), the
model's files (coordinator/data/model_files.py), every row of its data and the token length of
every prompt (coordinator/data/validate.py), and that each task of the data has an env section.

`check_inputs` raises the first problem as a ConfigError naming the key (and file, and line)
and what to change; warnings (prompts past policy.max_total_sequence_length) go to the console.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from coordinator.config import ConfigError, ExperimentConfig
from coordinator.config.checks import check_machine
from coordinator.data.model_checks import longest_prompt
from coordinator.data.model_files import check_model_dir
from coordinator.data.sources import data_source
from coordinator.data.validate import (
    LengthReport,
    check_lengths,
    load_examples,
    load_pairs,
    load_tokens,
    measure_prompts,
)
from coordinator.loop.scoring import check_tasks_configured
from coordinator.run.paths import prepare_inputs


def check_inputs(cfg: ExperimentConfig, console: Console | None = None) -> tuple[str, Path, Path | None]:
    """Check the run's inputs (building the embedded ones if asked); returns what
    run.paths.prepare_inputs returns: the model directory and the train/val files."""
    with console.status("checking the model and the data...") if console is not None else nullcontext():
        return _check(cfg, console)


def _check(cfg: ExperimentConfig, console: Console | None) -> tuple[str, Path, Path | None]:
    check_machine(cfg)
    _check_user_paths(cfg)
    model_dir, train_path, val_path = prepare_inputs(cfg)
    check_model_dir(model_dir, "policy.model_name" if cfg.policy.model_name else "the embedded model's cache")
    for task, env in cfg.env.items():
        if env.scorer.needs_model and env.reward_model.model_name is not None:
            check_model_dir(env.reward_model.model_name, f"env.{task}.reward_model.model_name")
    sources = {"data.train_path": (train_path, cfg.data.train_split), "data.val_path": (val_path, cfg.data.val_split)}
    if not cfg.algorithm.uses_rollouts:
        for key, (path, _) in sources.items():
            if path is not None:
                load_pairs(path, cfg.data, key)
        return model_dir, train_path, val_path
    if data_source(cfg.data).uniform_prompts:  # the embedded task: every prompt has the longest one's length
        longest, source, _ = longest_prompt(cfg)
        overflowing = int(longest + cfg.policy.generation.max_new_tokens > cfg.policy.max_total_sequence_length)
        _warn(console, check_lengths(cfg, LengthReport(source, 1, [], overflowing, longest)))
        return model_dir, train_path, val_path
    tokens = load_tokens(cfg.policy.model_name, model_dir)
    data = {f"{key} ({path})": load_examples(path, cfg.data, tokens, key, split)
            for key, (path, split) in sources.items() if path is not None}
    check_tasks_configured({source: {e.task for e in rows} for source, rows in data.items()}, set(cfg.env))
    for source, rows in data.items():
        _warn(console, check_lengths(cfg, measure_prompts(cfg, rows, source)))
    return model_dir, train_path, val_path


def _warn(console: Console | None, warning: str | None) -> None:
    if warning and console is not None:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def _check_user_paths(cfg: ExperimentConfig) -> None:
    """The data files a jsonl run names exist, before anything is built."""
    if not cfg.data.dataset_name.from_files:
        return
    for key in ("train_path", "val_path"):
        value = getattr(cfg.data, key)
        if value is not None and not Path(value).exists():
            raise ConfigError(f"data.{key}: {value} does not exist; give the path of a JSONL file")
