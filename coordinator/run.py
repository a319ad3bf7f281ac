"""A whole run in local mode: prepare the model and data, launch every service, SFT-warm,
GRPO, validate, and write the summary, plot and checkpoints. Every service it started is
stopped at the end, on an error and on Ctrl-C.

Restarts. A trainer that dies during GRPO (its process exits, or it stops answering) is
relaunched, up to cluster.max_trainer_restarts times; the loop goes back to the last
complete checkpoint (trainer state, cursor, metrics, RNG) and publishes the restored
weights as a new version to the generators, which kept running. A coordinator that dies
is resumed by running it again on the same run (`--resume`, or automatically when the run
has a checkpoint and did not finish): it serves on the same address, the services that
outlived it re-register and are adopted (coordinator/cluster.py), and the loop resumes
from the last checkpoint in the same way.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import grpc
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from coordinator import checkpoint
from coordinator import resume as resuming
from coordinator.cluster import HostedService, LocalCluster
from coordinator.recovery import resume_version, trainer_dead
from coordinator.algorithms.context import LoopContext
from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.config import ExperimentConfig
from coordinator.data import PromptCursor, Tokens, read_jsonl
from coordinator.metrics import MetricsLog, plot_curves
from coordinator.scoring import check_tasks_configured
from coordinator.services import Services
from coordinator.status import RunStatus
from coordinator.validation import validate
from tandem.logs import file_logger
from tandem.rpc import TokenMissing, load_token


def cache_root() -> Path:
    return Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache" / "tandem"))


def default_run_name() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def make_run_dir(cfg: ExperimentConfig) -> Path:
    name = cfg.logger.run_name or default_run_name()
    run_dir = Path(cfg.logger.log_dir).resolve() / name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    return run_dir


def prepare_inputs(cfg: ExperimentConfig) -> tuple[str, Path, Path | None]:
    """The model directory and the train/val files (building the embedded ones if asked: the
    arithmetic task, or its toy preference pairs for DPO/RM)."""
    model_dir = cfg.policy.model_name
    if model_dir is None:
        from coordinator.embedded.tiny_model import ensure_tiny_model

        model_dir = str(ensure_tiny_model(cache_root()))
    if cfg.data.dataset_name in ("arithmetic", "arithmetic_preference"):
        from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
        from coordinator.embedded.preference import ensure_preference_dataset

        ensure = ensure_arithmetic_dataset if cfg.data.dataset_name == "arithmetic" else ensure_preference_dataset
        train, val = ensure(cache_root(), cfg.data.seed, cfg.data.num_train, cfg.data.num_val)
        return model_dir, train, val
    return model_dir, Path(cfg.data.train_path), Path(cfg.data.val_path) if cfg.data.val_path else None


def run_token(run_dir: Path) -> str:
    """The shared token: TANDEM_TOKEN/TANDEM_TOKEN_FILE if set, else the run's own, kept in
    <run>/token (mode 0600) so `tandem status` can read it and a restarted coordinator speaks
    to the services that outlived the previous one."""
    try:
        return load_token()
    except TokenMissing:
        path = run_dir / "token"
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        token = secrets.token_hex(16)
        path.touch(mode=0o600)
        path.write_text(token)
        return token


class Run:
    def __init__(self, cfg: ExperimentConfig, console: Console | None = None, resume: bool | None = False,
                 hosted: Sequence[HostedService] = ()):
        """resume: True continues logger.run_name from its latest checkpoint (NothingToResume if
        there is none); None does so only if that run has a checkpoint and did not finish."""
        self.cfg = cfg
        self.hosted = hosted  # in-process services (the Python API's reward_fn), see LocalCluster
        self.console = console or Console(stderr=True)
        self.resume_from = (resuming.find_for(cfg) if resume  # raises NothingToResume
                            else resuming.find_unfinished(cfg) if resume is None else None)
        self.run_dir = make_run_dir(cfg)
        self.accuracy_before: float | None = None
        self._log_file = open(self.run_dir / "logs" / "coordinator.log", "a")
        self.log = file_logger("coordinator", self._log_file).bind(run_id=self.run_dir.name)
        self.status = RunStatus(self.run_dir.name)
        self.metrics = MetricsLog(self.run_dir, cfg.logger.tensorboard_enabled)
        self.timings: dict[str, float] = {}
        self.sft_steps = 0

    def execute(self) -> dict:
        cfg, log = self.cfg, self.log
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        started = time.perf_counter()
        self.console.print(f"[bold]Tandem run[/] {self.run_dir}")
        model_dir, train_path, val_path = prepare_inputs(cfg)
        check_tasks_configured({str(p): {e.task for e in read_jsonl(p, cfg.data)} for p in (train_path, val_path) if p},
                               set(cfg.env))  # before any service starts
        token = run_token(self.run_dir)
        cluster = LocalCluster(cfg, model_dir, self.run_dir, token, log, self.status, self.hosted,
                               adopt=self.resume_from is not None)
        with self.console.status("starting services (trainer, generators, rewards)..."):
            services = cluster.__enter__()  # stops whatever it started if start-up fails
        try:
            self.timings["startup_s"] = time.perf_counter() - started
            self.console.print(f"services up in {self.timings['startup_s']:.1f}s")
            summary = self._phases(services, model_dir, train_path, val_path, cluster)
        finally:
            cluster.close()
            self.metrics.close()
        return self._finish(summary, started)

    def _finish(self, summary: dict, started: float) -> dict:
        """Write summary.json (with wall time and per-phase timings), log the end, close the log."""
        summary["wall_time_s"] = time.perf_counter() - started
        summary["timings_s"] = self.timings
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        self.log.info("run_finished", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
        self._log_file.close()
        return summary

    def _phases(self, services: Services, model_dir: str, train_path: Path, val_path: Path | None,
                cluster: LocalCluster) -> dict:
        cfg, log, check_alive = self.cfg, self.log, cluster.launcher.check
        tokens = Tokens(model_dir)
        train = read_jsonl(train_path, cfg.data)
        val = read_jsonl(val_path, cfg.data)[: cfg.grpo.max_val_samples] if val_path else []
        ctx = LoopContext.connect(cfg, services, tokens, train, cfg.sft.seed, log)
        resumed = self._resume(ctx) if self.resume_from is not None else None

        summary: dict = {"run_dir": str(self.run_dir), "model": model_dir}
        clock = time.perf_counter()
        accuracy_start = self._warm_start(ctx, val, check_alive) if cfg.sft.max_num_steps and not resumed else None
        self.timings["sft_s"] = time.perf_counter() - clock
        clock = time.perf_counter()
        if resumed is not None:
            accuracy_start = resumed.accuracy_before
        elif accuracy_start is None and val:
            ctx.publish()
            accuracy_start = self._validate(ctx, val, step=0)
        elif accuracy_start is not None:
            self.metrics.log("val", 0, {"accuracy": accuracy_start})  # GRPO's starting point, for the plot
        summary["accuracy_before"] = self.accuracy_before = accuracy_start
        ctx.cursor = PromptCursor(train, cfg.grpo.seed)
        if resumed is not None:
            ctx.cursor.load_state(resumed.cursor)
        if cfg.grpo.max_num_steps:
            self._grpo(ctx, train, val, cluster, first_step=resumed.step + 1 if resumed else 1)
        accuracy_end = self._validate(ctx, val, step=cfg.grpo.max_num_steps) if val else None
        self.timings["grpo_s"] = time.perf_counter() - clock
        summary.update(accuracy_after=accuracy_end, grpo_steps=cfg.grpo.max_num_steps, sft_steps=self.sft_steps,
                       samples=cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt,
                       weight_version=ctx.publisher.version)
        if cfg.logger.plot_enabled:
            summary["plot"] = str(plot_curves(self.metrics.history, self.run_dir / "curves.png"))
        return summary

    def _grpo(self, ctx: LoopContext, train, val, cluster: LocalCluster, first_step: int) -> None:
        """The GRPO steps; a trainer that dies is relaunched and the loop resumes from the last
        checkpoint (at most cluster.max_trainer_restarts times)."""
        cfg = self.cfg

        def step_fn(step: int) -> dict:
            metrics = grpo_step(ctx, step)
            if val and cfg.grpo.val_period and step % cfg.grpo.val_period == 0 and step < cfg.grpo.max_num_steps:
                metrics["val_accuracy"] = self._validate(ctx, val, step)
            if cfg.checkpointing.enabled and step % cfg.checkpointing.save_period == 0:
                self._checkpoint(ctx, step, metrics)
            return metrics

        restarts = 0
        while True:
            try:
                self._loop("grpo", cfg.grpo.max_num_steps, step_fn, cluster.launcher.check, first_step=first_step)
                return
            except Exception as exc:
                if restarts >= cfg.cluster.max_trainer_restarts or not trainer_dead(ctx.services, cluster.launcher):
                    raise
                restarts += 1
                first_step = self._restart_trainer(ctx, train, cluster, exc) + 1

    def _restart_trainer(self, ctx: LoopContext, train, cluster: LocalCluster, exc: Exception) -> int:
        """Relaunch the dead trainer, load the last checkpoint into it, publish the restored
        weights as a new version; returns the checkpoint's step."""
        root = resuming.checkpoint_root(self.cfg.checkpointing.checkpoint_dir, self.run_dir)
        self.log.warning("trainer_dead", error=f"{type(exc).__name__}: {exc}"[:500])
        if checkpoint.latest(root) is None:
            raise RuntimeError(f"the trainer died before the run's first checkpoint (under {root}); nothing to "
                               f"resume from: lower checkpointing.save_period or restart the run") from exc
        self.console.print("[yellow]the trainer died: relaunching it and resuming from the last checkpoint[/]")
        self.status.update(phase="recovering")
        started = time.perf_counter()
        cluster.restart_trainer()
        relaunched = time.perf_counter() - started
        fresh = LoopContext.connect(self.cfg, ctx.services, ctx.tokens, train, self.cfg.grpo.seed, self.log)
        ctx.publisher = fresh.publisher  # the new trainer hosts a new weight-sync store
        state = self._restore(ctx, *resuming.find(root), train)
        self.timings["trainer_restart_s"] = self.timings.get("trainer_restart_s", 0.0) + time.perf_counter() - started
        self.log.info("trainer_restarted", step=state.step, weight_version=ctx.publisher.version,
                      relaunch_s=round(relaunched, 3), restart_to_resume_s=round(time.perf_counter() - started, 3))
        return state.step

    def _warm_start(self, ctx: LoopContext, val, check_alive) -> float | None:
        """SFT in calls of sft.val_period steps; after each, publish and check held-out
        accuracy, stopping once it reaches sft.stop_at_accuracy. Returns the last accuracy."""
        cfg = self.cfg.sft
        done, accuracy = 0, None
        chunks = -(-cfg.max_num_steps // cfg.val_period)

        def chunk(_: int) -> dict:
            nonlocal done, accuracy
            size = min(cfg.val_period, cfg.max_num_steps - done)
            metrics = sft_steps(ctx, size)
            done += size
            ctx.publish()
            if val:
                accuracy = metrics["val_accuracy"] = self._validate(ctx, val, step=0, phase="sft_val")
            metrics["sft_steps"] = float(done)
            metrics["weight_version"] = float(ctx.publisher.version)
            return metrics

        def finished(metrics: dict) -> bool:
            return cfg.stop_at_accuracy is not None and metrics.get("val_accuracy", 0.0) >= cfg.stop_at_accuracy

        self._loop("sft", chunks, chunk, check_alive, stop=finished)
        self.sft_steps = done
        self.log.info("warm_start_done", sft_steps=done, accuracy=accuracy)
        return accuracy

    def _validate(self, ctx: LoopContext, val, step: int, phase: str = "val") -> float:
        self.status.update(phase="validate")
        result = validate(ctx.services, ctx.tokens, val, self.cfg.policy.generation.max_new_tokens, self.log)
        self.metrics.log(phase, step, result)
        self.log.info("validation", step=step, **result)
        return result["accuracy"]

    def _checkpoint(self, ctx: LoopContext, step: int, metrics: dict[str, float]) -> None:
        root = resuming.checkpoint_root(self.cfg.checkpointing.checkpoint_dir, self.run_dir)
        row = {"phase": "grpo", "step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        state = resuming.LoopState(step=step, weight_version=ctx.publisher.version, cursor=ctx.cursor.state(),
                                   metrics=[*self.metrics.history, row],  # this step's row is logged after
                                   sft_steps=self.sft_steps, accuracy_before=self.accuracy_before,
                                   rng=resuming.capture_rng())
        started = time.perf_counter()
        checkpoint.save(root, step, state.to_json(), ctx.services.trainer, self.cfg.checkpointing.keep_top_k, self.log)
        self.timings["checkpoint_s"] = self.timings.get("checkpoint_s", 0.0) + time.perf_counter() - started

    def _resume(self, ctx: LoopContext) -> resuming.LoopState:
        """Continue from the checkpoint found at start (see _restore)."""
        started = time.perf_counter()
        state = self._restore(ctx, *self.resume_from)
        self.timings["resume_s"] = time.perf_counter() - started
        self.console.print(f"resumed from {self.resume_from[0]} (GRPO step {state.step}, "
                           f"weight version {ctx.publisher.version})")
        return state

    def _restore(self, ctx: LoopContext, path: Path, state: resuming.LoopState, train=None) -> resuming.LoopState:
        """Load the checkpoint into the trainer, restore the loop's state (and, given the
        training set, its cursor), and publish the restored weights: under the checkpoint's
        version, or a newer one if a generator already serves a later version (it outlived
        the trainer or the coordinator)."""
        started = time.perf_counter()
        ctx.services.trainer.load_checkpoint(str((path / "trainer").resolve()))
        generators = ctx.services.all_generators()
        version = resume_version(state.weight_version, [ctx.publisher.version, *_served(generators)])
        ctx.publish(generators, version=version)
        self.metrics.history = list(state.metrics)
        resuming.rewrite_metrics(self.metrics.path, state.metrics)
        resuming.restore_rng(state.rng)
        self.sft_steps = state.sft_steps
        if train is not None:
            ctx.cursor = PromptCursor(train, self.cfg.grpo.seed)
            ctx.cursor.load_state(state.cursor)
        self.status.update(phase="grpo", step=state.step, weight_version=version)
        self.log.info("resumed", path=str(path), step=state.step, checkpoint_weight_version=state.weight_version,
                      weight_version=version, seconds=round(time.perf_counter() - started, 3))
        return state

    def _loop(self, phase: str, num_steps: int, step_fn, check_alive, stop=lambda metrics: False,
              first_step: int = 1) -> None:
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
                self.status.update(step=step, last_metrics=metrics, weight_version=int(metrics.get("weight_version", 0)))
                self.log.info("step", phase=phase, step=step, **{k: round(v, 5) for k, v in metrics.items()})
                progress.update(task, advance=1, description=_describe(metrics))
                if stop(metrics):
                    progress.update(task, total=step)
                    break


def _served(generators) -> list[int]:
    """The weight versions the generators serve (those that do not answer are skipped)."""
    versions = []
    for g in generators:
        try:
            versions.append(g.client.info(timeout_s=5.0).weight_version)
        except grpc.RpcError:
            pass
    return versions


def _describe(metrics: dict[str, float]) -> str:
    keys = [("loss", "loss"), ("reward_mean", "reward"), ("val_accuracy", "held-out acc"), ("kl", "kl")]
    return "  ".join(f"{label} {metrics[key]:.3f}" for key, label in keys if key in metrics)
