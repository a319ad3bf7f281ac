"""A DPO or reward-model run in local mode: only the trainer is launched (no generator, no
reward service); each step is one optimizer step on policy.train_global_batch_size preference
pairs; the trained model is exported as an HF checkpoint into <run>/hf (for RM, what
reward_svc's reward_model scorer serves). Everything else (run dir, logs, metrics.jsonl,
tensorboard, summary.json, stopping what was started) is as in `coordinator.run.Run`.
Loop checkpoints and --resume are GRPO-only for now.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from rich.console import Console

from coordinator.algorithms.pairs import DpoValidator, PreferenceContext, dpo_step, rm_step
from coordinator.checkpoint.export import export_hf
from coordinator.config import ExperimentConfig
from coordinator.config.preference import Algorithm
from coordinator.data.examples import PromptCursor
from coordinator.data.inputs import prepare_inputs
from coordinator.data.preference import PreferencePair, read_pairs
from coordinator.data.tokens import Tokens
from coordinator.launch.local import HostedService
from coordinator.metrics.log import plot_curves
from coordinator.run.base import RunBase
from trainer_svc.client import TrainerClient


class PreferenceRun(RunBase):
    """DPO (dpo.*) or reward-model training (rm.*) through the trainer service alone."""

    def __init__(self, cfg: ExperimentConfig, console: Console | None = None, hosted: Sequence[HostedService] = ()):
        assert not cfg.algorithm.uses_rollouts, "PreferenceRun runs dpo and rm configs"
        super().__init__(cfg, console, hosted)

    def execute(self) -> dict:
        cfg = self.cfg
        self._begin(f"Tandem {cfg.algorithm.value} run")
        if cfg.checkpointing.enabled:
            self.log.warning("checkpointing_ignored", reason="loop checkpoints are GRPO-only; the run ends with an HF export")
            self.console.print("[yellow]checkpointing.enabled is ignored for dpo/rm runs (GRPO-only for now); "
                               "the run ends with an HF export[/]")
        model_dir, train_path, val_path = prepare_inputs(cfg)
        train = read_pairs(train_path, cfg.data)
        val = read_pairs(val_path, cfg.data) if val_path else []
        with self._services(model_dir, "the trainer") as (services, _):
            summary = self._train(services.trainer, model_dir, train, val)
        return self._finish(summary)

    def _train(self, trainer: TrainerClient, model_dir: str, train: list[PreferencePair],
               val: list[PreferencePair]) -> dict:
        cfg, phase = self.cfg, self.cfg.algorithm.value
        section = cfg.dpo if cfg.algorithm is Algorithm.DPO else cfg.rm
        ctx = PreferenceContext(cfg, trainer, Tokens(model_dir), PromptCursor(train, section.seed), self.log)
        steps_per_epoch = math.ceil(len(train) / cfg.policy.train_global_batch_size)
        num_steps = min(section.max_num_steps, section.max_num_epochs * steps_per_epoch)
        summary: dict = {"run_dir": str(self.run_dir), "model": model_dir, "algorithm": phase, "steps": num_steps}
        validator = None
        if cfg.algorithm is Algorithm.DPO and val:
            validator = DpoValidator(ctx, val[:cfg.dpo.max_val_samples])
            if cfg.dpo.val_at_start:
                summary["val_accuracy_before"] = self._validate_pairs(validator, 0)
        step_fn = dpo_step if cfg.algorithm is Algorithm.DPO else rm_step
        clock = self._clock()

        period = cfg.dpo.val_period if validator else 0
        with self.steps(phase, num_steps) as steps:
            for step in steps.over(range(1, num_steps + 1)):
                metrics = step_fn(ctx)
                if period and step % period == 0 and step < num_steps:
                    metrics["val_accuracy"] = self._validate_pairs(validator, step)
                steps.record(step, metrics)
        self._stop_clock(f"{phase}_s", clock)
        if validator is not None:
            summary["val_accuracy_after"] = self._validate_pairs(validator, num_steps)
        rows = [row for row in self.metrics.history if row.get("phase") == phase]
        summary["train_accuracy_first"] = rows[0].get("accuracy") if rows else None
        summary["train_accuracy_last"] = rows[-1].get("accuracy") if rows else None
        exported = export_hf(trainer, self.run_dir / "hf", self.log)
        export = exported.path
        summary.update(hf=str(export), hf_export_s=exported.seconds)
        if cfg.logger.plot_enabled:
            summary["plot"] = str(plot_curves(self.metrics.history, self.run_dir / "curves.png", self.run_dir.name))
        self.console.print(f"exported the trained {'reward model' if phase == 'rm' else 'policy'} to {export}")
        if "val_accuracy_before" in summary:
            self.console.print(f"[bold]held-out reward accuracy: {summary['val_accuracy_before']:.1%} -> "
                               f"{summary['val_accuracy_after']:.1%}[/]")
        if rows:
            self.console.print(f"[bold]training pair accuracy: step 1 {summary['train_accuracy_first']:.1%} -> "
                               f"step {num_steps} {summary['train_accuracy_last']:.1%}[/]")
        return summary

    def _validate_pairs(self, validator: DpoValidator, step: int) -> float:
        self.status.update(phase="validate")
        started = time.perf_counter()
        result = validator()
        self._record_validation("val", step, result, time.perf_counter() - started)
        return result["accuracy"]
