"""The Python API: the same run as `tandem run`, driven from Python.

    from coordinator.api import GRPOTrainer, train

    summary = GRPOTrainer("recipe.yaml").train()
    summary = GRPOTrainer.from_pretrained("/models/my-model", max_steps=20, grpo__num_prompts_per_step=8).train()
    summary = train(model=None, dataset=[{"prompt": "2+2=", "answer": "4"}],
                    reward_fn=lambda prompt, completion, answer: float(completion.strip() == answer))

`.train()` launches every service and runs exactly what `tandem run` runs
(`coordinator.run.Run(cfg).execute()`); it returns the run's summary with its metric rows
under "metrics". A `reward_fn` is served from this process as the reward service of its task
(reward_svc/hosted.py), registered with the coordinator like any other.

Overrides (keyword arguments) are, in order of lookup: a friendly name (FRIENDLY_KEYS), a
dotted key given as `**{"grpo.max_num_steps": 5}`, `section__key` (`grpo__max_num_steps=5`),
or a section name with a dict (`grpo={"max_num_steps": 5}`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from coordinator.config import ConfigError, ExperimentConfig, load_config
from coordinator.config.run import LoggerConfig

FRIENDLY_KEYS = {
    "max_steps": "grpo.max_num_steps",
    "num_generators": "cluster.num_generators",
    "trainer_ranks": "cluster.trainer_ranks",
    "tensor_parallel_size": "policy.dtensor_cfg.tensor_parallel_size",
    "learning_rate": "policy.optimizer.kwargs.lr",
    "num_prompts_per_step": "grpo.num_prompts_per_step",
    "num_generations_per_prompt": "grpo.num_generations_per_prompt",
    "max_new_tokens": "policy.generation.max_new_tokens",
    "sft_steps": "sft.max_num_steps",
    "log_dir": "logger.log_dir",
    "run_name": "logger.run_name",
}
"""Keyword -> config key, for the handful of knobs most runs touch."""
SECTIONS = tuple(ExperimentConfig.model_fields)
DEFAULT_TASK = "custom"
"""The task a reward_fn serves when the dataset rows name none."""

RewardFn = Callable[[str, str, str], float]


def override_key(name: str) -> str:
    """The dotted config key a keyword argument stands for. Raises ConfigError."""
    if name in FRIENDLY_KEYS:
        return FRIENDLY_KEYS[name]
    key = name.replace("__", ".")
    if key.split(".")[0] not in SECTIONS:
        raise ConfigError(f"unknown override {name!r}: use one of {sorted(FRIENDLY_KEYS)}, a section "
                          f"({', '.join(SECTIONS)}) with a dict, or section__key / 'section.key'")
    return key


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set each override in the raw config dict (a dict value merges into the section)."""
    for name, value in overrides.items():
        path = override_key(name).split(".")
        if len(path) == 1 and not isinstance(value, Mapping):
            raise ConfigError(f"override {name!r}: section {path[0]} takes a dict of keys")
        _set(raw, path, value, name)
    return raw


def _set(node: dict, path: list[str], value: Any, name: str) -> None:
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {name!r}: {part} is not a section")
        node = child
    last = path[-1]
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for key, item in value.items():
            _set(node[last], [key], item, name)
    else:
        node[last] = dict(value) if isinstance(value, Mapping) else value


def _raw_config(config: str | Path | Mapping | None) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, ExperimentConfig):
        return config.model_dump(mode="json")
    if isinstance(config, Mapping):
        return json.loads(json.dumps(config))  # a deep copy; the caller's dict is left alone
    return load_config(config).model_dump(mode="json", exclude_unset=True)


class GRPOTrainer:
    """One GRPO run (SFT warm start, GRPO, validation, checkpoints) as `tandem run` does it.

    config: a dict in the YAML's schema, a YAML path, or an ExperimentConfig.
    reward_fns: task -> reward_fn(prompt, completion, answer) -> float, each served from this
    process for its task (the task's env section is marked external and created if absent).
    """

    def __init__(self, config: str | Path | Mapping | ExperimentConfig | None = None, *,
                 reward_fns: Mapping[str, RewardFn] | None = None, console: Console | None = None,
                 **overrides: Any):
        raw = apply_overrides(_raw_config(config), overrides)
        self.reward_fns = dict(reward_fns or {})
        for task in self.reward_fns:
            if "env" not in raw:  # keep the default tasks, and their rows' task for rows that name none
                raw["env"] = {t: {} for t in ExperimentConfig().env}
                raw.setdefault("data", {}).setdefault("default_task", ExperimentConfig().data.default_task)
            raw["env"].setdefault(task, {})["external"] = True
        self.config = load_config(raw=raw)
        self.console = console or Console(stderr=True)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: str | Path | Mapping | None = None,
                        **overrides: Any) -> GRPOTrainer:
        """A run on the HF checkpoint in model_dir (policy.model_name)."""
        return cls(config, **{"policy.model_name": str(model_dir), **overrides})

    def train(self) -> dict:
        """Launch the services, run, stop them all; returns the summary (plus "metrics": the
        rows of metrics.jsonl, each with its phase and step)."""
        from coordinator.run.create import create_run
        from reward_svc.hosted import FunctionRewardService

        run = create_run(self.config, self.console)  # a dpo / rm config runs that algorithm
        hosted = [FunctionRewardService(task, fn, run.log) for task, fn in self.reward_fns.items()]
        run.hosted = hosted
        summary = run.execute()
        summary["metrics"] = list(run.metrics.history)
        return summary


def train(model: str | Path | None = None, dataset: str | Path | Iterable[Mapping] | None = None,
          reward_fn: RewardFn | None = None, *, task: str | None = None, config: str | Path | Mapping | None = None,
          console: Console | None = None, **overrides: Any) -> dict:
    """Train `model` (an HF checkpoint dir; None: the embedded tiny model) with GRPO on
    `dataset` (a JSONL, parquet, arrow, JSON or CSV path or dataset directory, or rows with
    prompt/answer[/task] or messages/answer[/task]; None: the embedded arithmetic
    task), rewarded by `reward_fn(prompt, completion, answer) -> float` (None: the configured
    env scorers). A reward_fn serves `task` (default: the rows' task, else "custom"); list
    rows are written to <run dir>/data/train.jsonl. Returns the run's summary."""
    raw = apply_overrides(_raw_config(config), overrides)
    if model is not None:
        raw.setdefault("policy", {})["model_name"] = str(model)
    rows = None if dataset is None or isinstance(dataset, (str, Path)) else [dict(r) for r in dataset]
    if reward_fn is not None:
        task = task or _single_task(rows) or (None if dataset is None else DEFAULT_TASK)
        task = task or "arithmetic"  # the embedded dataset's task
        raw["env"] = {task: {"external": True}}
        raw.setdefault("data", {})["default_task"] = task
    if dataset is not None:
        data = raw.setdefault("data", {})
        jsonl = rows is not None or str(dataset).endswith(".jsonl")  # other files: through `datasets`
        data.update(dataset_name="jsonl" if jsonl else "local", train_path=str(dataset) if rows is None else None)
        if rows is not None:
            data["train_path"] = str(_write_rows(raw, rows))
    trainer = GRPOTrainer(raw, reward_fns={task: reward_fn} if reward_fn is not None else None, console=console)
    return trainer.train()


def _single_task(rows: list[dict] | None) -> str | None:
    tasks = {r["task"] for r in rows or [] if "task" in r}
    if len(tasks) > 1:
        raise ConfigError(f"dataset rows name several tasks {sorted(tasks)}; one reward_fn serves one task")
    return tasks.pop() if tasks else None


def _write_rows(raw: dict[str, Any], rows: list[dict]) -> Path:
    """Write the rows as JSONL in the run's directory (naming the run now if unnamed)."""
    from coordinator.run.paths import default_run_name

    if not rows:
        raise ConfigError("dataset is empty")
    for index, row in enumerate(rows):
        missing = [k for k in ("prompt", "answer") if k not in row]
        if missing:
            raise ConfigError(f"dataset row {index} lacks {missing}; each row needs prompt and answer (task optional)")
    logger = raw.setdefault("logger", {})
    logger.setdefault("run_name", None)
    logger["run_name"] = logger["run_name"] or default_run_name()
    run_dir = Path(logger.get("log_dir") or LoggerConfig().log_dir).resolve() / logger["run_name"]
    path = run_dir / "data" / "train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({k: str(v) for k, v in r.items()}) + "\n" for r in rows))
    return path
