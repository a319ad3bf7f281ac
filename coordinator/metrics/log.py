"""Where metrics go: a JSONL file (one line per step and phase), the sinks the logger section
enables (TensorBoard, W&B, MLflow: loggers.py), sample generations (samples.jsonl and the sinks),
and the history kept for the loop checkpoint and the final plot (plot.py).

Each row is logged at its phase's own step: SFT rows (and their held-out checks, `sft_val`) at
the SFT optimizer step, GRPO rows and validations (`val`) at the GRPO step, DPO/RM rows at theirs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from coordinator.config.run import LoggerConfig
from coordinator.metrics.plot import plot_run
from coordinator.metrics.sinks import build_sinks


class MetricsLog:
    def __init__(self, run_dir: Path, logger: LoggerConfig | bool = True, run_name: str | None = None,
                 on_sink_error: Callable[[str, Exception], None] | None = None):
        """logger: the logger section (a bool: TensorBoard on or off, nothing else). A sink that
        fails (a full disk, a W&B server that went away) is dropped with on_sink_error(name, error):
        the run goes on, metrics.jsonl keeps everything."""
        self._on_sink_error = on_sink_error or (lambda name, exc: None)
        cfg = logger if isinstance(logger, LoggerConfig) else LoggerConfig(tensorboard_enabled=bool(logger))
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.history: list[dict] = []
        self._sinks = build_sinks(cfg, run_dir, run_name or run_dir.name)

    def log(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        row = {"phase": phase, "step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self._each(lambda sink: sink.scalars(phase, step, metrics))

    def log_samples(self, phase: str, step: int, rows: list[dict]) -> None:
        """Sample generations of a validation (prompt, completion, answer, reward, correct, task)."""
        if not rows:
            return
        with open(self.samples_path, "a") as f:
            f.writelines(json.dumps({"phase": phase, "step": step, **row}) + "\n" for row in rows)
        self._each(lambda sink: sink.samples(phase, step, rows))

    def log_config(self, params: dict) -> None:
        self._each(lambda sink: sink.config(params))

    def _each(self, call: Callable[[object], None]) -> None:
        for sink in list(self._sinks):
            try:
                call(sink)
            except Exception as exc:  # noqa: BLE001 - a logging backend must not end a training run
                self._sinks.remove(sink)
                self._on_sink_error(type(sink).__name__, exc)

    def close(self) -> None:
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()


def plot_curves(history: list[dict], path: Path, title: str = "Tandem") -> Path:
    """curves.png of the run's phases (kept under this name for callers of the old single-panel plot)."""
    return plot_run(history, path, title)
