"""`tandem eval`: the held-out accuracy of a model, with no training. The validation of a run
(greedy completions of the held-out prompts, scored by the reward services), on:

- an HF checkpoint (policy.model_name, or the embedded model): only generators and reward
  services start (coordinator/launch/inference.py); vLLM serves the checkpoint's own weights;
- a loop checkpoint (runs/<run>/checkpoints/step_N): the trainer starts too, loads it and
  publishes its weights to the generators, as a resumed run would.

It writes a run directory like any run (logs, metrics.jsonl with one `eval` row, samples.jsonl,
summary.json with the accuracy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from coordinator.config import ExperimentConfig
from coordinator.data.examples import read_examples
from coordinator.data.inputs import prepare_inputs
from coordinator.data.tokens import Tokens
from coordinator.launch.inference import InferenceCluster
from coordinator.loop.context import LoopContext
from coordinator.loop.evaluation import validate
from coordinator.loop.scoring import RewardRouter
from coordinator.membership.services import GeneratorHandle, Services
from coordinator.run.base import RunBase


def is_loop_checkpoint(path: Path) -> bool:
    return (path / "trainer").is_dir() and (path / "coordinator.json").is_file()


@dataclass
class EvalContext:
    """What validation needs from a loop context, over generators that serve their own weights."""

    cfg: ExperimentConfig
    services: Services
    tokens: Tokens
    log: object
    agents: object | None = None
    """The rollout gateway for agent tasks (loop/rollouts.py agent_runner), started on first use."""

    def generators(self) -> list[GeneratorHandle]:
        return self.services.all_generators()

    def rewards(self) -> RewardRouter:
        return RewardRouter(self.services.reward_clients(), refresh=self.services.reward_clients,
                            on_failure=self.services.reward_failed, log=self.log)

    def pause(self, seconds: float) -> None:
        """Wait before looking for a missing service again (LoopContext.pause's face)."""
        time.sleep(seconds)


class EvalRun(RunBase):
    def __init__(self, cfg: ExperimentConfig, console: Console | None = None, checkpoint: Path | None = None):
        if not cfg.algorithm.uses_rollouts:
            raise ValueError(f"tandem eval measures generations; a {cfg.algorithm.value} config has none "
                             "(its run reports held-out pair accuracy itself)")
        if checkpoint is not None and not is_loop_checkpoint(checkpoint):
            raise ValueError(f"{checkpoint} is not a loop checkpoint (no trainer/ and coordinator.json in it); "
                             "for an HF checkpoint directory pass --model")
        super().__init__(cfg, console)
        self.checkpoint = checkpoint

    def execute(self) -> dict:
        cfg = self.cfg
        self._begin("Tandem eval")
        model_dir, _, val_path = prepare_inputs(cfg)
        if val_path is None:
            raise ValueError("tandem eval needs held-out rows: set data.val_path")
        tokens = Tokens(model_dir)
        val = read_examples(val_path, cfg.data, tokens, split=cfg.data.val_split)[: cfg.grpo.max_val_samples]
        started = time.perf_counter()
        if self.checkpoint is None:
            with self._services(model_dir, "generators and rewards", cluster_type=InferenceCluster) as (services, _):
                ctx = EvalContext(cfg, services, tokens, self.log)
                try:
                    accuracy = self._measure(ctx, val)
                finally:
                    if ctx.agents is not None:
                        ctx.agents.close()  # the rollout gateway
        else:
            with self._services(model_dir, "services (trainer, generators, rewards)") as (services, _):
                ctx = LoopContext.connect(cfg, services, tokens, val, cfg.grpo.seed, self.log,
                                          versions=self.status.versions)
                services.trainer.load_checkpoint(str((self.checkpoint / "trainer").resolve()))
                ctx.publish()
                try:
                    accuracy = self._measure(ctx, val)
                finally:
                    if ctx.agents is not None:
                        ctx.agents.close()  # the rollout gateway
        self.timings["eval_s"] = time.perf_counter() - started
        summary = {"run_dir": str(self.run_dir), "model": model_dir, "accuracy": accuracy, "num_samples": len(val),
                   "checkpoint": str(self.checkpoint) if self.checkpoint else None}
        return self._finish(summary)

    def _measure(self, ctx, val) -> float:
        self.status.update(phase="validate", total_steps=0)
        started, samples = time.perf_counter(), []
        result = validate(ctx, val, self.cfg.policy.generation.max_new_tokens, samples=samples)
        self._record_validation("eval", 0, result, time.perf_counter() - started, samples)
        return result["accuracy"]
