"""The run a config asks for: the rollout loop (GRPO/DAPO with its SFT warm start) or a
preference run (DPO, reward model)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from coordinator.checkpoint import resume as resuming
from coordinator.config import ExperimentConfig
from coordinator.launch.local import HostedService
from coordinator.preflight import check_inputs
from coordinator.run.base import RunBase


def create_run(cfg: ExperimentConfig, console: Console | None = None, resume: bool | None = False,
               hosted: Sequence[HostedService] = ()) -> RunBase:
    """resume: True continues logger.run_name from its latest checkpoint; None does so only if
    that run has one and did not finish (rollout runs only). Every input is checked first
    (coordinator/preflight/inputs.py): a problem is a ConfigError before anything is created or
    started."""
    if resume and not cfg.algorithm.uses_rollouts:
        raise ValueError(f"--resume is not supported for {cfg.algorithm.value} runs yet; start a new run")
    if resume:
        resuming.find_for(cfg)  # NothingToResume (RunFinished) before anything else
    check_inputs(cfg, console)
    if cfg.algorithm.uses_rollouts:
        from coordinator.run.grpo_run import Run

        return Run(cfg, console, resume=resume, hosted=hosted)
    from coordinator.run.preference_run import PreferenceRun

    return PreferenceRun(cfg, console, hosted=hosted)
