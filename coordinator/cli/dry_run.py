"""`tandem run --dry-run`: everything that can be checked without starting a service, each as
one line with a verdict, then exit 0 (all good) or 2 (something to fix). Nothing is started,
no run directory is made, the embedded model is not built.

Checked: the config (already loaded), the model (its files, its tokenizer, its context length
against the configured lengths), the engine's support for its architecture (vLLM's registry),
the data files (every row read and validated; tasks against env sections; the longest prompt
plus max_new_tokens against the engine's max_model_len), the scorers' and loggers' packages,
and what the run directory would do (start afresh or resume).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from coordinator.config import ExperimentConfig


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _guard(name: str, check: Callable[[], str]) -> Check:
    """Run one check: its detail if it passes, the error's message if it raises."""
    try:
        return Check(name, True, check())
    except Exception as exc:  # noqa: BLE001 - a dry run reports every failure instead of stopping at one
        return Check(name, False, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc))


def _model_dir(cfg: ExperimentConfig) -> str | None:
    """The model directory, or None for the embedded model when it is not built yet."""
    if cfg.policy.model_name is not None:
        return cfg.policy.model_name
    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import tiny_model_dir

    path = tiny_model_dir(cache_root())
    return str(path) if (path / "config.json").is_file() else None


def check_model(cfg: ExperimentConfig) -> str:
    model_dir = _model_dir(cfg)
    if model_dir is None:
        return "the embedded tiny model (built on the first run)"
    config = json.loads((Path(model_dir) / "config.json").read_text())
    weights = [p.name for p in Path(model_dir).glob("*") if p.suffix in (".safetensors", ".bin")]
    if not weights:
        raise ValueError(f"{model_dir} has no weights (*.safetensors or *.bin)")
    from coordinator.data.tokens import Tokens

    Tokens(model_dir)
    return f"{model_dir}: {', '.join(config.get('architectures', ['?']))}, {len(weights)} weight file(s), tokenizer ok"


def check_engine(cfg: ExperimentConfig) -> str:
    model_dir = _model_dir(cfg)
    plan = cfg.service_plan
    if not plan.generators:
        return f"{cfg.algorithm.value}: the trainer alone (no generation engine)"
    if not plan.generator_services:
        return "the trainer's Megatron model generates (checked when the trainer starts)"
    if cfg.policy.model_name is None:
        return "vLLM serves the embedded Llama model"
    architectures = json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or []
    from vllm.model_executor.models import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if not any(a in supported for a in architectures):
        raise ValueError(f"vLLM does not support {architectures or 'a model without architectures'}")
    return f"vLLM supports {', '.join(a for a in architectures if a in supported)}"


def check_data(cfg: ExperimentConfig) -> str:
    from coordinator.data.examples import read_examples
    from coordinator.data.preference import read_pairs
    from coordinator.loop.scoring import check_tasks_configured

    data = cfg.data
    if not data.dataset_name.from_files:
        return f"the embedded {data.dataset_name} data ({data.num_train} train, {data.num_val} held out)"
    splits = [(Path(p), split) for p, split in ((data.train_path, data.train_split), (data.val_path, data.val_split))
              if p]
    if not cfg.algorithm.uses_rollouts:
        counts = [len(read_pairs(p, data)) for p, _ in splits]
        return ", ".join(f"{p}: {n} pairs" for (p, _), n in zip(splits, counts))
    tokens = _tokens(cfg)
    rows = {p: read_examples(p, data, tokens, split=split) for p, split in splits}  # prompts rendered as the run will
    check_tasks_configured({str(p): {e.task for e in examples} for p, examples in rows.items()}, set(cfg.env))
    detail = ", ".join(f"{p}: {len(examples)} rows" for p, examples in rows.items())
    return detail + _prompt_room(cfg, max(len(e.prompt_ids) for examples in rows.values() for e in examples))


def _tokens(cfg: ExperimentConfig):
    """The run's tokenizer (the embedded one, built here, when policy.model_name is unset)."""
    from coordinator.data.tokens import Tokens

    return Tokens.of_run(cfg.policy.model_name, cfg.policy.model_name or "the embedded model")


def _prompt_room(cfg: ExperimentConfig, longest: int) -> str:
    """The longest prompt plus max_new_tokens must fit the engine and the trainer."""
    new = cfg.policy.generation.max_new_tokens
    limit = min(cfg.policy.generation.vllm_cfg.max_model_len, cfg.policy.max_total_sequence_length)
    if longest + new > limit:
        raise ValueError(f"the longest prompt has {longest} tokens: with max_new_tokens {new} it exceeds {limit} "
                         "(policy.generation.vllm_cfg.max_model_len / policy.max_total_sequence_length)")
    return f"; longest prompt {longest} tokens + {new} new <= {limit}"


def check_packages(cfg: ExperimentConfig) -> str:
    needed = {"math_verify": "math-verify"} if any(e.scorer.value == "math" for e in cfg.env.values()) else {}
    if cfg.logger.wandb_enabled:
        needed["wandb"] = "wandb"
    if cfg.logger.mlflow_enabled:
        needed["mlflow"] = "mlflow-skinny"
    missing = [package for module, package in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ValueError(f"missing packages: pip install {' '.join(missing)}")
    return "installed: " + (", ".join(needed.values()) if needed else "nothing extra needed")


def check_run_dir(cfg: ExperimentConfig) -> str:
    from coordinator.run import resume

    log_dir = Path(cfg.logger.log_dir).resolve()
    parent = next(p for p in [log_dir, *log_dir.parents] if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"cannot write under {parent} (logger.log_dir)")
    found = resume.find_unfinished(cfg) if cfg.logger.run_name and cfg.algorithm.uses_rollouts else None
    if found is not None:
        return f"would resume {log_dir / cfg.logger.run_name} from {found[0].name}"
    return f"a new run under {log_dir}"


CHECKS = [("model", check_model), ("engine", check_engine), ("data", check_data), ("packages", check_packages),
          ("run dir", check_run_dir)]


def dry_run(cfg: ExperimentConfig, console: Console) -> int:
    results = [Check("config", True, f"{cfg.algorithm.value} on {cfg.policy.backend.value}, "
                     f"{cfg.cluster.launch} launch")]
    for name, check in CHECKS:
        results.append(_guard(name, lambda check=check: check(cfg)))
    for result in results:
        mark = "[green]ok[/]  " if result.ok else "[red]FAIL[/]"
        console.print(f"{mark} {result.name:<9} {result.detail}", highlight=False, soft_wrap=True)
    failed = [r.name for r in results if not r.ok]
    console.print("dry run: nothing was started; " + (f"fix: {', '.join(failed)}" if failed else "ready to run"))
    return 2 if failed else 0
