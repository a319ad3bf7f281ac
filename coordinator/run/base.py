"""What every run has, whatever its algorithm: its directory and log, the status the
coordinator's server reports, metrics (and the W&B / MLflow / TensorBoard sinks), per-phase
timings, the services it started (stopped at the end, on an error and on Ctrl-C; services
started by someone else, `cluster.launch: external`, are told the run is over), the progress of
its start-up and step loops (progress.py: bars in a terminal, timestamped lines elsewhere),
validations with their sample generations, and summary.json."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import yaml
from rich.console import Console
from rich.markup import escape

from coordinator.config import ExperimentConfig
from coordinator.launch.local import HostedService, LocalCluster
from coordinator.membership.dismiss import dismiss_services
from coordinator.membership.services import Services
from coordinator.membership.status import RunStatus
from coordinator.metrics.log import MetricsLog
from coordinator.metrics.progress import RunProgress, describe_startup
from coordinator.run.paths import make_run_dir, run_token
from tandem.logs import file_logger

DISMISS_TIMEOUT_S = 30.0
"""How long a run that ends waits for the services it did not start to drain and leave."""


class RunBase:
    def __init__(self, cfg: ExperimentConfig, console: Console | None = None, hosted: Sequence[HostedService] = ()):
        self.cfg = cfg
        self.hosted = hosted  # in-process services (the Python API's reward_fn), see LocalCluster
        self.console = console or Console(stderr=True)
        self.progress = RunProgress(self.console)
        self.run_dir = make_run_dir(cfg)
        self._log_file = open(self.run_dir / "logs" / "coordinator.log", "a")
        self.log = file_logger("coordinator", self._log_file).bind(run_id=self.run_dir.name)
        self.status = RunStatus(self.run_dir.name)
        self.metrics = MetricsLog(self.run_dir, cfg.logger, self.run_dir.name, on_sink_error=self._sink_failed)
        self.timings: dict[str, float] = {}
        self.last_validation: dict[str, float] = {}
        """The metrics of the latest held-out check."""
        self._started = time.perf_counter()
        self.cluster: LocalCluster | None = None
        """The run's services, while they run."""

    def _sink_failed(self, name: str, exc: Exception) -> None:
        self.log.warning("metric_sink_dropped", sink=name, error=f"{type(exc).__name__}: {exc}"[:500])
        self.progress.note(f"[yellow]{name} failed and is no longer written ({type(exc).__name__}: {exc}); "
                           "metrics.jsonl has every metric[/]")

    def _begin(self, title: str) -> None:
        self._started = time.perf_counter()
        resolved = self.cfg.model_dump(mode="json")
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
        self.metrics.log_config(resolved)
        self.progress.note(f"{title} {self.run_dir}")

    @contextmanager
    def _services(self, model_dir: str, waiting_on: str, adopt: bool = False,
                  cluster_type: type[LocalCluster] = LocalCluster,
                  meanwhile: Callable[[], object] | None = None) -> Iterator[tuple[Services, LocalCluster]]:
        """Start (or adopt) the run's services, doing `meanwhile` while they boot; every one is
        stopped when the block ends."""
        cluster = cluster_type(self.cfg, model_dir, self.run_dir, run_token(self.run_dir), self.log, self.status,
                               self.hosted, adopt=adopt, meanwhile=meanwhile,
                               notify=lambda text: self.progress.note(f"[yellow]{escape(text)}[/]"))
        verb = self.cfg.cluster.launch.startup
        trainer = cluster_type is LocalCluster

        def describe() -> str:
            return describe_startup(self.cfg, cluster.registry.live(), trainer=trainer)

        with self.progress.waiting(f"{verb} {waiting_on}", describe):
            services = cluster.__enter__()  # stops whatever it started if start-up fails
        self.cluster = cluster
        try:
            self.timings["startup_s"] = time.perf_counter() - self._started
            self.progress.note(f"services up in {self.timings['startup_s']:.1f}s")
            yield services, cluster
        finally:
            if self.cfg.cluster.launch.dismisses_services:  # started by someone else: they leave by themselves
                dismiss_services(cluster.registry, DISMISS_TIMEOUT_S, self.log)
            cluster.close()
            self.cluster = None
            self.metrics.close()

    def _clock(self) -> tuple[float, float]:
        """A phase's start, for _stop_clock."""
        return time.perf_counter(), self.timings.get("val_s", 0.0)

    def _stop_clock(self, name: str, clock: tuple[float, float]) -> None:
        """timings[name] += the wall time since `clock`, without the validations in it (timings["val_s"])."""
        started, validating = clock
        spent = time.perf_counter() - started - (self.timings.get("val_s", 0.0) - validating)
        self.timings[name] = self.timings.get(name, 0.0) + spent

    def _finish(self, summary: dict) -> dict:
        """Write summary.json (with wall time and per-phase timings), log the end, close the log."""
        summary["wall_time_s"] = time.perf_counter() - self._started
        summary["timings_s"] = self.timings
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        self.log.info("run_finished", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
        self._log_file.close()
        return summary

    def _record_validation(self, phase: str, step: int, result: dict[str, float], seconds: float,
                           samples: Sequence[dict] = ()) -> None:
        """Log a held-out check (metrics at the phase's step, its first logger.num_val_samples_to_print
        generations, its time in timings["val_s"]) and say it on the console."""
        self.metrics.log(phase, step, result)
        self.last_validation = dict(result)
        self.metrics.log_samples(phase, step, list(samples[: self.cfg.logger.num_val_samples_to_print]))
        self.timings["val_s"] = self.timings.get("val_s", 0.0) + seconds
        self.log.info("validation", phase=phase, step=step, seconds=round(seconds, 3), **result)
        of = {"sft_val": "SFT", "val": self.cfg.algorithm.value.upper()}.get(phase, phase)
        count = f"{int(result['num_samples'])} samples, " if "num_samples" in result else ""
        self.progress.note(f"held-out check at {of} step {step}: accuracy {result['accuracy']:.1%} ({count}{seconds:.1f}s)")

    @contextmanager
    def steps(self, phase: str, total: int, *, done: int = 0) -> Iterator[PhaseSteps]:
        """Record a phase's steps (the phase's step `done` is the last one already taken)."""
        self.status.update(phase=phase, step=done, total_steps=total)
        with self.progress.phase(phase, total, completed=done) as bar:
            yield PhaseSteps(self, phase, bar, done)

    def service_restarts(self) -> int:
        """Services relaunched so far (0 before the services start)."""
        return sum(self.cluster.launcher.restarts.values()) if self.cluster is not None else 0

    def check_alive(self) -> None:
        """Raise if a service the run started has died beyond recovery."""
        if self.cluster is not None:
            self.cluster.launcher.check()


class PhaseSteps:
    """One phase's steps as the run records them: before each, a liveness check; after each,
    its metrics row (metrics.jsonl, with its wall time per step `time_step_s`), the status that
    `tandem status` shows, a log line and the progress display."""

    def __init__(self, run: RunBase, phase: str, bar, done: int):
        self.run, self.phase, self.bar, self.done = run, phase, bar, done
        self._started = time.perf_counter()

    def over(self, steps: Iterable[int]) -> Iterator[int]:
        """`steps`, each after a liveness check of the run's services."""
        for step in steps:
            self.begin()
            yield step

    def begin(self) -> None:
        self.run.check_alive()
        self.run.status.update(phase=self.phase)
        self._started = time.perf_counter()

    def record(self, step: int, metrics: dict[str, float], *, last: bool = False) -> None:
        """Log step `step` (a call that ran several steps, an SFT chunk, records its last one);
        `last`: the phase ends here, before its planned total."""
        run, first = self.run, self.done + 1
        metrics.setdefault("time_step_s", (time.perf_counter() - self._started) / max(step - self.done, 1))
        self.done = step
        run.metrics.log(self.phase, step, metrics)
        run.status.update(step=step, last_metrics=metrics)
        run.log.info("step", phase=self.phase, step=step, **{k: round(v, 5) for k, v in metrics.items()})
        if "first_step_s" not in run.timings:  # how long the run took to do any training
            run.timings["first_step_s"] = time.perf_counter() - run._started
            steps = f"step {step}" if step == first else f"steps {first}-{step}"  # a chunk
            run.progress.note(f"first {self.phase} {steps} done {run.timings['first_step_s']:.1f}s after the run began")
        self.bar.update(step, _describe(metrics), total=step if last else None)
        if last:
            run.status.update(total_steps=step)


def _describe(metrics: dict[str, float]) -> str:
    keys = [("loss", "loss"), ("reward_mean", "reward"), ("val_accuracy", "held-out acc"), ("kl", "kl"),
            ("time_step_s", "s/step")]
    return "  ".join(f"{label} {metrics[key]:.3f}" for key, label in keys if key in metrics)
