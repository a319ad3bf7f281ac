"""Where metrics go: a JSONL file (one line per step and phase), the sinks the logger section
enables (TensorBoard, W&B, MLflow: loggers.py), sample generations (samples.jsonl and the sinks),
and the history: for the final plot (plot.py), and marked by each loop checkpoint without a copy
of its rows (coordinator/checkpoint/history.py).

Each row is logged at its phase's own step: SFT rows (and their held-out checks, `sft_val`) at
the SFT optimizer step, GRPO rows and validations (`val`) at the GRPO step, DPO/RM rows at theirs.
"""

from __future__ import annotations

import hashlib
import json
import os
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
        self._offset = self.path.stat().st_size if self.path.is_file() else 0  # an earlier run's rows end here
        self._logged = hashlib.sha256()  # of the rows of `history`, as written
        self._sinks = build_sinks(cfg, run_dir, run_name or run_dir.name)

    def log(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        row = {"phase": phase, "step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        line = json.dumps(row) + "\n"
        self.history.append(row)
        with open(self.path, "a") as f:
            f.write(line)
        self._logged.update(line.encode())
        self._each(lambda sink: sink.scalars(phase, step, metrics))

    def written(self) -> tuple[int, int, str]:
        """The rows of `history` in metrics.jsonl, for a loop checkpoint's mark of them
        (coordinator/checkpoint/history.py): the byte at which they begin (an earlier run's rows,
        under the same name, come before), how many, and the sha256 of their lines as written."""
        return self._offset, len(self.history), self._logged.hexdigest()

    def restore(self, lines: list[str]) -> None:
        """Make metrics.jsonl and the history exactly `lines` (a checkpoint's rows, as written:
        those the interrupted run logged after the checkpoint are dropped, and a resumed run logs
        those steps again); an earlier run's rows before them in the file go too."""
        text = "".join(line + "\n" for line in lines)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self.history = [json.loads(line) for line in lines]
        self._offset, self._logged = 0, hashlib.sha256(text.encode())

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
