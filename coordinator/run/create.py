"""The run a config asks for: the rollout loop (GRPO/DAPO with its SFT warm start) or a
preference run (DPO, reward model)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from coordinator.cluster.local import HostedService
from coordinator.config import ExperimentConfig
from coordinator.data.model_checks import check_model
from coordinator.run.base import RunBase


def create_run(cfg: ExperimentConfig, console: Console | None = None, resume: bool | None = False,
               hosted: Sequence[HostedService] = ()) -> RunBase:
    """resume: True continues logger.run_name from its latest checkpoint; None does so only if
    that run has one and did not finish (rollout runs only). The checkpoint and prompts are
    checked against the config first (coordinator/data/model_checks.py): nothing starts for a
    model the run cannot serve or train."""
    check_model(cfg)
    if cfg.algorithm.uses_rollouts:
        from coordinator.run.grpo_run import Run

        return Run(cfg, console, resume=resume, hosted=hosted)
    if resume:
        raise ValueError(f"--resume is not supported for {cfg.algorithm.value} runs yet; start a new run")
    from coordinator.run.preference_run import PreferenceRun

    return PreferenceRun(cfg, console, hosted=hosted)
