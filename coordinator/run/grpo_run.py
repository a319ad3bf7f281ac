"""A whole run in local mode: prepare the model and data, launch every service, SFT-warm,
GRPO, validate, and write the summary, plot and checkpoints. Every service it started is
stopped at the end, on an error and on Ctrl-C.

Restarts. A trainer that dies during GRPO (its process exits, or it stops answering) is
relaunched, up to cluster.max_trainer_restarts times; the loop goes back to the last
complete checkpoint (trainer state, cursor, metrics, RNG) and publishes the restored
weights as a new version to the generators, which kept running. A coordinator that dies
is resumed by running it again on the same run (`--resume`, or automatically when the run
has a checkpoint and did not finish): it serves on the same address, the services that
outlived it re-register and are adopted (coordinator/launch/local.py), and the loop resumes
from the last checkpoint in the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from coordinator.algorithms.sft import sft_steps
from coordinator.checkpoint import resume as resuming
from coordinator.checkpoint import store
from coordinator.checkpoint.export import export_hf
from coordinator.checkpoint.history import HistoryMark, HistoryMismatch
from coordinator.config import ExperimentConfig
from coordinator.data.examples import Example, PromptCursor, dataset_tasks, read_examples
from coordinator.data.inputs import prepare_inputs
from coordinator.data.tokens import Tokens
from coordinator.launch.local import HostedService, LocalCluster
from coordinator.launch.supervisor import dead_trainers
from coordinator.loop.context import LoopContext
from coordinator.loop.evaluation import validate
from coordinator.loop.ledger import StepSamples
from coordinator.loop.scoring import check_tasks_configured
from coordinator.membership.services import Services
from coordinator.metrics.log import plot_curves
from coordinator.run.base import RunBase
from tandem.kinds import ServiceKind
from tandem.rpc import RpcFailure


class Run(RunBase):
    """The rollout loop: SFT warm start, GRPO/DAPO, validation, checkpoints, restarts."""

    def __init__(self, cfg: ExperimentConfig, console: Console | None = None, resume: bool | None = False,
                 hosted: Sequence[HostedService] = ()):
        """resume: True continues logger.run_name from its latest checkpoint (NothingToResume if
        there is none); None does so only if that run has a checkpoint and did not finish."""
        self.resume_from = (resuming.find_for(cfg) if resume  # raises NothingToResume
                            else resuming.find_unfinished(cfg) if resume is None else None)
        super().__init__(cfg, console, hosted)
        if self.resume_from is not None:  # a metrics.jsonl that is not the checkpoint's fails before any service starts
            try:
                resuming.history_lines(self.metrics.path, *self.resume_from)
            except HistoryMismatch:
                self._log_file.close()
                raise
        self.accuracy_before: float | None = None
        self.sft_steps = 0
        self._val: list[Example] = []  # the held-out examples GRPO validates on
        self._checkpoints: store.CheckpointWriter | None = None  # created at the first checkpoint

    def execute(self) -> dict:
        cfg = self.cfg
        self._begin("Tandem run")
        model_dir, train_path, val_path = prepare_inputs(cfg)
        splits = [(train_path, cfg.data.train_split), *([(val_path, cfg.data.val_split)] if val_path else [])]
        check_tasks_configured({str(p): dataset_tasks(p, cfg.data, split) for p, split in splits},
                               set(cfg.env))  # before any service starts
        loaded: dict = {}

        def read_data() -> None:  # while the services boot: the tokenizer, the prompts rendered and tokenized
            import coordinator.algorithms.grpo  # noqa: F401  (and torch, ~1.3 CPU-s, off the first step's path)

            tokens = Tokens.of_run(cfg.policy.model_name, model_dir)
            loaded.update(tokens=tokens, train=read_examples(train_path, cfg.data, tokens),
                          val=read_examples(val_path, cfg.data, tokens, split=cfg.data.val_split) if val_path else [])

        what = "trainer, critic" if cfg.service_plan.critic_ranks else "trainer"
        with self._services(model_dir, f"services ({what}, generators, rewards)", adopt=self.resume_from is not None,
                            meanwhile=read_data) as (services, cluster):
            summary = self._phases(services, model_dir, loaded["tokens"], loaded["train"],
                                   loaded["val"][: cfg.grpo.max_val_samples], cluster)
        return self._finish(summary)

    def _phases(self, services: Services, model_dir: str, tokens: Tokens, train: list[Example], val: list[Example],
                cluster: LocalCluster) -> dict:
        cfg, self._val = self.cfg, val
        ctx = LoopContext.connect(cfg, services, tokens, train, cfg.sft.seed, self.log, versions=self.status.versions)
        resumed = self._resume(ctx) if self.resume_from is not None else None

        summary: dict = {"run_dir": str(self.run_dir), "model": model_dir}
        clock = self._clock()
        accuracy_start = self._warm_start(ctx) if cfg.sft.max_num_steps and not resumed else None
        self._stop_clock("sft_s", clock)
        clock = self._clock()
        if resumed is not None:
            accuracy_start = resumed.accuracy_before
        elif accuracy_start is None and val and cfg.grpo.val_at_start:
            # No publish first: nothing has changed the trainer's weights since it loaded the
            # checkpoint, which every generator loaded too, in the dtype the trainer trains in
            # (weight version 0, coordinator/membership/versions.py); step 1's publish is the first.
            accuracy_start = self.validate(ctx, 0)
        elif accuracy_start is not None:
            self.metrics.log("val", 0, dict(self.last_validation))  # GRPO's starting point: the last SFT check
        summary["accuracy_before"] = self.accuracy_before = accuracy_start
        ctx.cursor = PromptCursor(train, cfg.grpo.seed)
        if resumed is not None:
            ctx.cursor.load_state(resumed.cursor)
        else:
            self.ledger_path.unlink(missing_ok=True)  # GRPO from its first step: a ledger of its own
        if cfg.grpo.max_num_steps:
            try:
                self._grpo(ctx, train, cluster, first_step=resumed.step + 1 if resumed else 1)
            except BaseException:
                if self._checkpoints is not None:
                    self._checkpoints.settle()  # a write under way completes before the services stop
                raise
        self._checkpoints_written()
        accuracy_end = self.validate(ctx, cfg.grpo.max_num_steps) if val else None
        self._stop_clock("grpo_s", clock)
        summary.update(algorithm=cfg.algorithm.value, accuracy_after=accuracy_end, grpo_steps=cfg.grpo.max_num_steps,
                       sft_steps=self.sft_steps,
                       samples=cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt,
                       weight_version=ctx.publisher.version)
        exported = export_hf(ctx.services.trainer, self.run_dir / "hf", self.log)  # the trained model, for anyone
        summary.update(hf=str(exported.path), hf_export_s=exported.seconds)
        if cfg.logger.plot_enabled:
            summary["plot"] = str(plot_curves(self.metrics.history, self.run_dir / "curves.png", self.run_dir.name))
        return summary

    def _grpo(self, ctx: LoopContext, train, cluster: LocalCluster, first_step: int) -> None:
        """The GRPO loop (coordinator/algorithms/grpo.py train_grpo) over the rollout pipeline; a
        trainer that dies is relaunched and the loop resumes from the last checkpoint (at most
        cluster.max_trainer_restarts times)."""
        # Imported here: the algorithms import torch (~1 s), which the services' launch need not
        # wait for (tests/unit/coordinator/launch/test_launch_imports.py); read_data imported them meanwhile.
        from coordinator.algorithms.grpo import train_grpo
        from coordinator.loop.rollouts import rollout_pipeline

        rollouts, restarts = rollout_pipeline(ctx), 0
        while True:
            try:
                train_grpo(ctx, self, rollouts, first_step=first_step)
                return
            except Exception as exc:
                dead = [] if restarts >= self.cfg.cluster.max_trainer_restarts else self._dead_trainers(ctx, cluster,
                                                                                                         exc)
                if not dead:
                    raise
                restarts += 1
                rollouts.stop()
                first_step = self._restart_trainer(ctx, train, cluster, exc, dead) + 1
            finally:
                rollouts.stop()
                if ctx.agents is not None:
                    ctx.agents.close()  # the rollout gateway

    @property
    def validates(self) -> bool:
        return bool(self._val)

    def _dead_trainers(self, ctx: LoopContext, cluster: LocalCluster, exc: Exception) -> list[ServiceKind]:
        """The trainer services (the policy's; a PPO run's critic too) that are gone: first those whose
        process exited or that do not answer, else those whose process exits within a grace period
        after the failed call (another rank's death: supervisor.trainer_dead)."""
        kinds = [ServiceKind.TRAINER, *([ServiceKind.CRITIC] if self.cfg.ppo is not None else [])]
        return dead_trainers(ctx.services, cluster.launcher, kinds, exc)

    def _restart_trainer(self, ctx: LoopContext, train, cluster: LocalCluster, exc: Exception,
                         dead: list[ServiceKind]) -> int:
        """Relaunch the dead trainer services (`dead`: the policy's trainer, a PPO run's critic or
        both), load the last checkpoint into the trainer and the critic (both go back to it, whichever
        died), publish the restored weights as a new version; returns the checkpoint's step."""
        root = resuming.checkpoint_root(self.cfg.checkpointing.checkpoint_dir, self.run_dir)
        self.log.warning("trainer_dead", services=[str(k) for k in dead], error=f"{type(exc).__name__}: {exc}"[:500])
        if self._checkpoints is not None and (lost := self._checkpoints.settle()) is not None:
            self.log.warning("checkpoint_lost", error=str(lost)[:500])  # the one it was writing: not resumed from
        if store.latest(root) is None:
            raise RuntimeError(f"the trainer died before the run's first checkpoint (under {root}); nothing to "
                               f"resume from: lower checkpointing.save_period or restart the run") from exc
        names = " and the ".join(str(k) for k in dead)
        self.console.print(f"[yellow]the {names} died: relaunching it and resuming from the last checkpoint[/]")
        self.status.update(phase="recovering")
        started = time.perf_counter()
        for kind in dead:
            cluster.restart_trainer(kind)
        relaunched = time.perf_counter() - started
        if ServiceKind.TRAINER in dead:
            fresh = LoopContext.connect(self.cfg, ctx.services, ctx.tokens, train, self.cfg.grpo.seed, self.log,
                                        versions=self.status.versions)
            ctx.publisher = fresh.publisher  # the new trainer hosts a new weight-sync store

        state = self._restore(ctx, *resuming.find(root), train)
        self.timings["trainer_restart_s"] = self.timings.get("trainer_restart_s", 0.0) + time.perf_counter() - started
        self.log.info("trainer_restarted", step=state.step, weight_version=ctx.publisher.version,
                      relaunch_s=round(relaunched, 3), restart_to_resume_s=round(time.perf_counter() - started, 3))
        return state.step

    def _warm_start(self, ctx: LoopContext) -> float | None:
        """SFT in calls of sft.val_period steps (sft.near_target_val_period once a held-out check
        has reached half of sft.stop_at_accuracy); after each, publish and check held-out
        accuracy, stopping once it reaches sft.stop_at_accuracy. Returns the last accuracy."""
        cfg = self.cfg.sft
        done, accuracy, best = 0, None, None
        with self.steps("sft", cfg.max_num_steps) as steps:
            while done < cfg.max_num_steps:
                steps.begin()
                size = min(_sft_chunk(cfg, best), cfg.max_num_steps - done)
                metrics = sft_steps(ctx, size)
                done += size
                ctx.publish()
                if self._val:
                    accuracy = metrics["val_accuracy"] = self.validate(ctx, done, phase="sft_val")
                    best = max(accuracy, best or 0.0)
                metrics["sft_steps"] = float(done)
                metrics["weight_version"] = float(ctx.publisher.version)
                reached = cfg.stop_at_accuracy is not None and metrics.get("val_accuracy", 0.0) >= cfg.stop_at_accuracy
                steps.record(done, metrics, last=reached)
                if reached:
                    break
        self.sft_steps = done
        self.log.info("warm_start_done", sft_steps=done, accuracy=accuracy)
        return accuracy

    def validate(self, ctx: LoopContext, step: int, *, phase: str = "val") -> float:
        """Held-out accuracy of the published weights on the run's validation set."""
        self.status.update(phase="validate")
        started, samples = time.perf_counter(), []
        result = validate(ctx, self._val, self.cfg.policy.generation.max_new_tokens, samples=samples)
        self._record_validation(phase, step, result, time.perf_counter() - started, samples)
        return result["accuracy"]

    @property
    def ledger_path(self) -> Path:
        """<run>/ledger.jsonl: which samples each GRPO step trained on (coordinator/loop/ledger.py),
        one line per step of the run's history (a resume drops the lines after its checkpoint)."""
        return self.run_dir / "ledger.jsonl"

    def trained(self, samples: StepSamples) -> None:
        with open(self.ledger_path, "a") as f:
            f.write(json.dumps(samples.to_json(), separators=(",", ":")) + "\n")

    def checkpoint(self, ctx: LoopContext, step: int, metrics: dict[str, float], cursor: dict[str, int]) -> None:
        """`cursor`: the data cursor after this step's prompts (later steps' may be drawn already)."""
        root = resuming.checkpoint_root(self.cfg.checkpointing.checkpoint_dir, self.run_dir)
        row = {"phase": "grpo", "step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        state = resuming.LoopState(step=step, weight_version=ctx.publisher.version, cursor=cursor,
                                   history=HistoryMark.after(self.metrics.written(), row),  # row: logged after
                                   sft_steps=self.sft_steps, accuracy_before=self.accuracy_before,
                                   rng=resuming.capture_rng())
        started = time.perf_counter()
        if self._checkpoints is None:
            self._checkpoints = store.CheckpointWriter(root, self.cfg.checkpointing.keep_top_k, self.log,
                                                       save_hf=self.cfg.checkpointing.save_hf,
                                                       max_failures=self.cfg.checkpointing.max_failed_saves)
        critic = ctx.services.critic if self.cfg.ppo is not None else None  # PPO: the critic's state with the policy's
        saving = self._checkpoints.save(step, state.to_json(), ctx.services.trainer, critic)  # written in the background
        blocked = time.perf_counter() - started
        self.timings["checkpoint_s"] = self.timings.get("checkpoint_s", 0.0) + blocked
        if saving is None:
            self.progress.note(f"[yellow]checkpoint at GRPO step {step} failed (logs/coordinator.log: "
                               f"checkpoint_failed); the last complete one stays, and the run goes on[/]")
        else:
            self.progress.note(f"checkpoint at GRPO step {step} ({blocked:.1f}s, written in the background)")

    def _checkpoints_written(self) -> None:
        """The last checkpoint on disk and complete (a failed one counts as any failed save:
        CheckpointWriteFailed past checkpointing.max_failed_saves in a row)."""
        if self._checkpoints is not None:
            self._checkpoints.wait()
            self.timings["checkpoint_write_s"] = self._checkpoints.write_seconds

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
        history = resuming.history_lines(self.metrics.path, path, state)  # before anything changes
        ctx.services.trainer.load_checkpoint(str((path / "trainer").resolve()))
        if self.cfg.ppo is not None:
            if not (path / "critic").is_dir():
                raise ValueError(f"{path} holds no critic/ (it was not written by a ppo run): resume a ppo run from "
                                 "its own checkpoints")
            ctx.services.critic.load_checkpoint(str((path / "critic").resolve()))
        generators = ctx.services.all_generators()

        version = resuming.resume_version(state.weight_version, [ctx.publisher.version, *_served(generators)])
        ctx.publish(generators, version=version)
        self.metrics.restore(history)
        resuming.truncate_ledger(self.ledger_path, state.step)
        resuming.restore_rng(state.rng)
        self.sft_steps = state.sft_steps
        if train is not None:
            ctx.cursor = PromptCursor(train, self.cfg.grpo.seed)
            ctx.cursor.load_state(state.cursor)
        self.status.update(phase="grpo", step=state.step)
        self.log.info("resumed", path=str(path), step=state.step, checkpoint_weight_version=state.weight_version,
                      weight_version=version, seconds=round(time.perf_counter() - started, 3))
        return state


def _served(generators) -> list[int]:
    """The weight versions the generators serve (those that do not answer are skipped)."""
    versions = []
    for g in generators:
        try:
            versions.append(g.client.info(timeout_s=5.0).weight_version)
        except RpcFailure:
            pass
    return versions


def _sft_chunk(cfg, best: float | None) -> int:
    """SFT steps before the next held-out check: sft.near_target_val_period once the best check so
    far (`best`; the checks are noisy) reached half of sft.stop_at_accuracy, else sft.val_period."""
    near = (cfg.near_target_val_period is not None and cfg.stop_at_accuracy is not None and best is not None
            and best >= cfg.stop_at_accuracy / 2)
    return cfg.near_target_val_period if near else cfg.val_period
