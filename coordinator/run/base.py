"""What every run has, whatever its algorithm: its directory and log, the status the
coordinator's server reports, metrics, per-phase timings, the services it started (stopped at
the end, on an error and on Ctrl-C), the progress of its step loops, and summary.json."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from coordinator.cluster.local import HostedService, LocalCluster
from coordinator.cluster.services import Services
from coordinator.cluster.status import RunStatus
from coordinator.config import ExperimentConfig
from coordinator.run.metrics import MetricsLog
from coordinator.run.paths import make_run_dir, run_token
from tandem.logs import file_logger


class RunBase:
    def __init__(self, cfg: ExperimentConfig, console: Console | None = None, hosted: Sequence[HostedService] = ()):
        self.cfg = cfg
        self.hosted = hosted  # in-process services (the Python API's reward_fn), see LocalCluster
        self.console = console or Console(stderr=True)
        self.run_dir = make_run_dir(cfg)
        self._log_file = open(self.run_dir / "logs" / "coordinator.log", "a")
        self.log = file_logger("coordinator", self._log_file).bind(run_id=self.run_dir.name)
        self.status = RunStatus(self.run_dir.name)
        self.metrics = MetricsLog(self.run_dir, cfg.logger.tensorboard_enabled)
        self.timings: dict[str, float] = {}
        self._started = time.perf_counter()

    def _begin(self, title: str) -> None:
        self._started = time.perf_counter()
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
        self.console.print(f"[bold]{title}[/] {self.run_dir}")

    @contextmanager
    def _services(self, model_dir: str, waiting_on: str, adopt: bool = False,
                  meanwhile: Callable[[], object] | None = None) -> Iterator[tuple[Services, LocalCluster]]:
        """Start (or adopt) the run's services, doing `meanwhile` while they boot; every one is
        stopped when the block ends."""
        cluster = LocalCluster(self.cfg, model_dir, self.run_dir, run_token(self.run_dir), self.log, self.status,
                               self.hosted, adopt=adopt, meanwhile=meanwhile,
                               notify=lambda text: self.console.print(f"[yellow]{escape(text)}[/]"))
        with self.console.status(f"starting {waiting_on}..."):
            services = cluster.__enter__()  # stops whatever it started if start-up fails
        try:
            self.timings["startup_s"] = time.perf_counter() - self._started
            self.console.print(f"services up in {self.timings['startup_s']:.1f}s")
            yield services, cluster
        finally:
            cluster.close()
            self.metrics.close()

    def _finish(self, summary: dict) -> dict:
        """Write summary.json (with wall time and per-phase timings), log the end, close the log."""
        summary["wall_time_s"] = time.perf_counter() - self._started
        summary["timings_s"] = self.timings
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        self.log.info("run_finished", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
        self._log_file.close()
        return summary

    def _loop(self, phase: str, num_steps: int, step_fn: Callable[[int], dict], check_alive: Callable[[], None],
              stop: Callable[[dict], bool] = lambda metrics: False, first_step: int = 1) -> None:
        """Run step_fn(step) for first_step..num_steps with a progress bar; log each step's metrics."""
        self.status.update(phase=phase, step=0, total_steps=num_steps)
        columns = [TextColumn(f"[bold]{phase:>4}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}")]
        with Progress(*columns, console=self.console, transient=False) as progress:
            task = progress.add_task("", total=num_steps, completed=first_step - 1)
            for step in range(first_step, num_steps + 1):
                check_alive()
                self.status.update(phase=phase)
                metrics = step_fn(step)
                self.metrics.log(phase, step, metrics)
                self.status.update(step=step, last_metrics=metrics)
                self.log.info("step", phase=phase, step=step, **{k: round(v, 5) for k, v in metrics.items()})
                progress.update(task, advance=1, description=_describe(metrics))
                if stop(metrics):
                    progress.update(task, total=step)
                    break


def _describe(metrics: dict[str, float]) -> str:
    keys = [("loss", "loss"), ("reward_mean", "reward"), ("val_accuracy", "held-out acc"), ("kl", "kl")]
    return "  ".join(f"{label} {metrics[key]:.3f}" for key, label in keys if key in metrics)
