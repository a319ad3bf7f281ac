"""The metric sinks beside metrics.jsonl: TensorBoard, Weights & Biases and MLflow (logger.*,
NeMo-RL's keys). Each gets the same scalars under the same names (`<phase>/<metric>`) at the same
steps (the phase's own step: an SFT row at its SFT step, a GRPO row at its GRPO step), the
resolved config, and the sample generations of each validation.

MLflow's names differ in one way: after the phase, `/` becomes `.` (its file store keeps a
metric as a file, so `grpo/reward_mean` and `grpo/reward_mean/arithmetic` cannot both exist).

W&B keeps one step counter per run and refuses to go back, while a run's phases each count
from 1; so every phase gets its own step metric (`<phase>/step`) and its scalars are plotted
against it (define_metric), which is how NeMo-RL logs its phases too. In offline mode the run is
written under <run dir>/wandb and nothing touches the network.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Protocol

from coordinator.config.run import LoggerConfig

SAMPLE_COLUMNS = ("task", "prompt", "completion", "answer", "reward", "correct")


class SinkError(RuntimeError):
    """A logger the config enables cannot start; the message names the key and what to change."""


class Sink(Protocol):
    def scalars(self, phase: str, step: int, metrics: dict[str, float]) -> None: ...
    def samples(self, phase: str, step: int, rows: list[dict]) -> None: ...
    def config(self, params: dict) -> None: ...
    def close(self) -> None: ...


def build_sinks(cfg: LoggerConfig, run_dir: Path, run_name: str) -> list[Sink]:
    """The sinks the logger section enables (a missing package is an error that says what to install)."""
    sinks: list[Sink] = []
    if cfg.tensorboard_enabled:
        sinks.append(TensorBoardSink(Path(cfg.tensorboard.log_dir or run_dir / "tensorboard")))
    for key, enabled, sink in (("logger.wandb_enabled", cfg.wandb_enabled, WandbSink),
                               ("logger.mlflow_enabled", cfg.mlflow_enabled, MlflowSink)):
        if not enabled:
            continue
        try:
            sinks.append(sink(cfg, run_dir, run_name))
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the library raises, say which key and what to try
            hint = "logger.wandb.mode=offline, or WANDB_API_KEY" if sink is WandbSink else "logger.mlflow.tracking_uri"
            raise SinkError(f"{key}: {type(exc).__name__}: {exc} (check {hint}, or set {key}=false)") from None
    return sinks


def _require(module: str, package: str, key: str):
    try:
        return __import__(module)
    except ImportError:
        raise SinkError(f"{key} needs the {package} package: pip install {package} "
                        f"(or set {key}=false)") from None


def flatten(params: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, object] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def samples_markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table (TensorBoard renders text summaries as Markdown)."""
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", "\\n")
    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in SAMPLE_COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(f"{phase}/{key}", float(value), step)

    def samples(self, phase: str, step: int, rows: list[dict]) -> None:
        self._writer.add_text(f"{phase}/samples", samples_markdown(rows), step)

    def config(self, params: dict) -> None:
        self._writer.add_text("config", "```yaml\n" + json.dumps(params, indent=1) + "\n```", 0)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_name: str):
        wandb = _require("wandb", "wandb", "logger.wandb_enabled")
        section = cfg.wandb
        mode = section.mode or os.environ.get("WANDB_MODE") or "online"
        settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False,
                                  x_disable_stats=True, x_disable_machine_info=True)
        self._wandb = wandb
        self._run = wandb.init(project=section.project, name=section.name or run_name, entity=section.entity,
                               mode=mode, dir=str(run_dir), id=_wandb_id(run_name), resume="allow",
                               settings=settings)
        self._phases: set[str] = set()

    def _phase(self, phase: str) -> None:
        if phase not in self._phases:
            self._run.define_metric(f"{phase}/step", hidden=True)
            self._run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
            self._phases.add(phase)

    def scalars(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        self._phase(phase)
        self._run.log({**{f"{phase}/{k}": float(v) for k, v in metrics.items()}, f"{phase}/step": step})

    def samples(self, phase: str, step: int, rows: list[dict]) -> None:
        self._phase(phase)
        table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows])
        self._run.log({f"{phase}/samples": table, f"{phase}/step": step})

    def config(self, params: dict) -> None:
        self._run.config.update(params, allow_val_change=True)

    def close(self) -> None:
        self._run.finish()


def _wandb_id(run_name: str) -> str:
    """A W&B run id from the run's name (a resumed run continues the same W&B run)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", run_name)[:64]


class MlflowSink:
    """Through MlflowClient (no global active run: a Python API caller's own MLflow state is left alone)."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_name: str):
        _require("mlflow", "mlflow-skinny", "logger.mlflow_enabled")
        from mlflow.tracking import MlflowClient

        section = cfg.mlflow
        uri = section.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):  # MLflow 3 keeps its file store only on request (no database to set up)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # nothing leaves the machine unless asked
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(section.experiment_name)
        experiment_id = (experiment.experiment_id if experiment is not None else
                         self._client.create_experiment(section.experiment_name, section.artifact_location))
        run = (self._client.get_run(section.run_id) if section.run_id else
               self._client.create_run(experiment_id, run_name=section.run_name or run_name))
        self.run_id = run.info.run_id
        self.tracking_uri = uri

    def scalars(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(f"{phase}/{k}"), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(batch), 1000):
            self._client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def samples(self, phase: str, step: int, rows: list[dict]) -> None:
        text = "".join(json.dumps({"phase": phase, "step": step, **r}) + "\n" for r in rows)
        self._client.log_text(self.run_id, text, f"samples/{phase}-step{step:06d}.jsonl")

    def config(self, params: dict) -> None:
        from mlflow.entities import Param

        flat = [Param(_mlflow_key(k), json.dumps(v) if not isinstance(v, str) else v) for k, v in flatten(params).items()]
        for start in range(0, len(flat), 100):
            self._client.log_batch(self.run_id, params=flat[start:start + 100])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    """MLflow allows letters, digits, _ - . / and spaces in names. Its file store keeps a metric
    as a file named by its path, so `grpo/reward_mean` and `grpo/reward_mean/arithmetic` cannot
    both exist: after the phase, slashes become dots (`grpo/reward_mean.arithmetic`)."""
    phase, _, name = key.partition("/")
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", f"{phase}/{name.replace('/', '.')}" if name else phase)
