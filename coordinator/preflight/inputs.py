"""Every check made before a run starts anything, stage by stage, used by `tandem run` (each
stage in turn, the first problem raised: check_inputs) and by `tandem run --dry-run` (every stage
reported on its own line: coordinator/cli/dry_run.py):

    machine    the directories the run writes, the memory its generators reserve (machine.py),
               and the data files the config names exist
    model      the model's files (model_files.py), the checkpoint against the config (model.py),
               a reward model's files, a distillation teacher's files and tokenizer (teacher.py),
               a PPO critic's own checkpoint and tokenizer (critic.py),
               each service's expected peak memory against the memory available (memory.py),
               a chat template when a task is an agent's (the rollout gateway renders with it)
    data       every row of the train and val files (data.py), each row's task against the env
               sections, the tokenizer against the model's vocabulary, every prompt's length
               against the generators and the trainer (lengths.py)
    packages   the packages the scorers and loggers import
    engine     (dry run only: it imports vLLM, seconds the run's start need not pay) that vLLM
               serves the model's architecture

A problem is a ConfigError naming the key (and file, and line) and what to change; warnings
(prompts past policy.max_total_sequence_length) go to the console. `tandem run` builds the
embedded model and task first when the config asks for them; a dry run builds nothing and says
what it could not check yet.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from coordinator.config import ConfigError, ExperimentConfig
from coordinator.data.inputs import prepare_data, prepare_model
from coordinator.data.sources import data_source
from coordinator.loop.scoring import check_tasks_configured
from coordinator.preflight.critic import check_critic
from coordinator.preflight.data import load_examples, load_pairs, load_tokens
from coordinator.preflight.lengths import check_lengths, measure_embedded_task, measure_examples
from coordinator.preflight.machine import available_memory_bytes, check_machine
from coordinator.preflight.memory import MemoryEstimate, check_memory, estimate_memory
from coordinator.preflight.model import check_model, check_vocab
from coordinator.preflight.model_files import check_chat_template, check_model_dir
from coordinator.preflight.teacher import check_teacher, check_teacher_length
from tandem.model_memory import ModelShape


def check_inputs(cfg: ExperimentConfig, console: Console | None = None) -> tuple[str, Path, Path | None]:
    """`tandem run`'s checks (building the embedded inputs if asked); returns the model directory
    and the train/val files, as coordinator.data.inputs.prepare_inputs."""
    checks = Preflight(cfg)
    with console.status("checking the model and the data...") if console is not None else nullcontext():
        for _, stage in checks.stages():
            stage()
    for warning in checks.warnings:
        if console is not None:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
    if console is not None and checks.memory is not None:
        console.print(f"memory: {escape(checks.memory.describe())}")
    assert checks.model_dir is not None and checks.train_path is not None
    return checks.model_dir, checks.train_path, checks.val_path


@dataclass
class Preflight:
    """One config's checks; each stage returns what it found, in words, or raises ConfigError.
    What a stage finds (the model's directory and config.json, the data files) serves the next."""

    cfg: ExperimentConfig
    build: bool = True
    """Build the embedded model and task when the config names them (a dry run builds nothing)."""
    warnings: list[str] = field(default_factory=list)
    model_dir: str | None = None
    model_config: dict | None = None
    train_path: Path | None = None
    val_path: Path | None = None
    memory: MemoryEstimate | None = None
    """Each service's expected peak memory (the model stage)."""

    def stages(self, *, dry_run: bool = False) -> list[tuple[str, Callable[[], str]]]:
        run = [("machine", self.machine), ("model", self.model), ("data", self.data), ("packages", self.packages)]
        return [*run, ("engine", self.engine)] if dry_run else run

    def machine(self) -> str:
        check_machine(self.cfg)
        data = self.cfg.data
        if data.dataset_name.from_files:
            for key in ("train_path", "val_path"):
                value = getattr(data, key)
                if value is not None and not Path(value).exists():
                    raise ConfigError(f"data.{key}: {value} does not exist; give the path of a JSONL file")
        return f"{self.cfg.logger.log_dir} writable, memory for the generators' KV cache"

    def model(self) -> str:
        cfg = self.cfg
        self.model_dir = prepare_model(cfg) if self.build else _built_model(cfg)
        teacher = "; " + check_teacher(cfg, cfg.policy.model_name and self.model_dir) if cfg.distillation else ""
        agents = [task for task, env in cfg.env.items() if env.served_by_agent]
        if agents and cfg.policy.model_name is None:
            raise ConfigError(f"env.{agents[0]}.agent: agent tasks need a chat model (the rollout gateway applies its "
                              "chat template) and the embedded tiny model has none; set policy.model_name to an "
                              "instruct/chat checkpoint")
        if cfg.ppo is not None:
            teacher += "; " + check_critic(cfg, cfg.policy.model_name and self.model_dir)
        if self.model_dir is None:
            return "the embedded tiny model (built on the first run)" + teacher
        check_model_dir(self.model_dir, "policy.model_name" if cfg.policy.model_name else "the embedded model's cache")
        if agents:
            check_chat_template(self.model_dir, f"env.{agents[0]}.agent")
        for task, env in cfg.env.items():
            if env.scorer.needs_model and env.reward_model.model_name is not None:
                check_model_dir(env.reward_model.model_name, f"env.{task}.reward_model.model_name")
        self.model_config = check_model(cfg)
        config = self.model_config or json.loads((Path(self.model_dir) / "config.json").read_text())
        self.memory = estimate_memory(cfg, ModelShape.from_config(config))
        check_memory(cfg, self.memory, available_memory_bytes())  # before anything starts
        return f"{self.model_dir}: {', '.join(config.get('architectures', ['?']))}; {self.memory.describe()}" + teacher

    def data(self) -> str:
        cfg, data = self.cfg, self.cfg.data
        if self.build or data.dataset_name.from_files:
            self.train_path, self.val_path = prepare_data(cfg)
        sources = {"data.train_path": (self.train_path, data.train_split),
                   "data.val_path": (self.val_path, data.val_split)}
        if not cfg.algorithm.uses_rollouts:
            pairs = {key: len(load_pairs(path, data, key)) for key, (path, _) in sources.items() if path is not None}
            return ", ".join(f"{key}: {n} pairs" for key, n in pairs.items()) or f"the embedded {data.dataset_name} pairs"
        if cfg.policy.model_name is None and data_source(data).uniform_prompts:  # every default run
            return self._lengths(measure_embedded_task(cfg))
        if self.train_path is None:  # a dry run, the embedded task not built yet
            return f"the embedded {data.dataset_name} data ({data.num_train} train, {data.num_val} held out)"
        tokens = load_tokens(cfg.policy.model_name, self.model_dir or "the embedded model")
        if self.model_config is not None:
            check_vocab(len(tokens), self.model_config)
        rows = {f"{key} ({path})": load_examples(path, data, tokens, key, split)
                for key, (path, split) in sources.items() if path is not None}
        check_tasks_configured({source: {e.task for e in examples} for source, examples in rows.items()},
                               set(cfg.env))
        found = ", ".join(f"{source}: {len(examples)} rows" for source, examples in rows.items())
        for source, examples in rows.items():
            found += "; " + self._lengths(measure_examples(cfg, examples, source))
        return found

    def _lengths(self, report) -> str:
        warning = check_lengths(self.cfg, report)
        if self.cfg.distillation is not None:
            check_teacher_length(self.cfg, report.longest)
        if warning:
            self.warnings.append(warning)
        new = self.cfg.policy.generation.max_new_tokens
        return f"{report.source}: longest prompt {report.longest} tokens + {new} new"

    def packages(self) -> str:
        cfg = self.cfg
        needed = {"math_verify": "math-verify"} if any(e.scorer.value == "math" for e in cfg.env.values()) else {}
        if cfg.logger.wandb_enabled:
            needed["wandb"] = "wandb"
        if cfg.logger.mlflow_enabled:
            needed["mlflow"] = "mlflow-skinny"
        missing = [package for module, package in needed.items() if importlib.util.find_spec(module) is None]
        if missing:
            raise ConfigError(f"missing packages: pip install {' '.join(missing)}")
        return "installed: " + (", ".join(needed.values()) if needed else "nothing extra needed")

    def engine(self) -> str:
        cfg = self.cfg
        plan = self.cfg.service_plan
        if not plan.generators:
            return f"{cfg.algorithm.value}: the trainer alone (no generation engine)"
        if not plan.generator_services:
            return "the trainer's Megatron model generates (checked when the trainer starts)"
        if cfg.policy.model_name is None:
            return "vLLM serves the embedded Llama model"
        architectures = (self.model_config or {}).get("architectures") or []
        from vllm.model_executor.models import ModelRegistry

        supported = set(ModelRegistry.get_supported_archs())
        if not any(a in supported for a in architectures):
            raise ConfigError(f"vLLM does not support {architectures or 'a model without architectures'}")
        return f"vLLM supports {', '.join(a for a in architectures if a in supported)}"


def _built_model(cfg: ExperimentConfig) -> str | None:
    """The model directory, or None for the embedded model when it is not built yet."""
    if cfg.policy.model_name is not None:
        return cfg.policy.model_name
    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import tiny_model_dir

    path = tiny_model_dir(cache_root())
    return str(path) if (path / "config.json").is_file() else None
