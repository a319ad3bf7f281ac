"""`tandem run --dry-run`: every check a run makes before it starts anything (the stages of
coordinator/preflight/inputs.py), plus whether vLLM serves the model and what the run directory
would do (start afresh or resume), each as one line with a verdict; then exit 0 (all good) or 2
(something to fix). Nothing is started, no run directory is made, the embedded model is not built.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from coordinator.config import ExperimentConfig
from coordinator.preflight.inputs import Preflight


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _guard(name: str, check: Callable[[], str]) -> Check:
    """Run one check: its detail if it passes, the error's message if it raises."""
    try:
        return Check(name, True, check())
    except Exception as exc:  # noqa: BLE001 - a dry run reports every failure instead of stopping at one
        return Check(name, False, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc))


def check_run_dir(cfg: ExperimentConfig) -> str:
    from coordinator.checkpoint import resume

    log_dir = Path(cfg.logger.log_dir).resolve()
    parent = next(p for p in [log_dir, *log_dir.parents] if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"cannot write under {parent} (logger.log_dir)")
    found = resume.find_unfinished(cfg) if cfg.logger.run_name and cfg.algorithm.uses_rollouts else None
    if found is not None:
        return f"would resume {log_dir / cfg.logger.run_name} from {found[0].name}"
    return f"a new run under {log_dir}"


def dry_run(cfg: ExperimentConfig, console: Console) -> int:
    results = [Check("config", True, f"{cfg.algorithm.value} on {cfg.policy.backend.value}, "
                     f"{cfg.cluster.launch} launch")]
    checks = Preflight(cfg, build=False)
    for name, stage in [*checks.stages(dry_run=True), ("run dir", lambda: check_run_dir(cfg))]:
        results.append(_guard(name, stage))
    for result in results:
        mark = "[green]ok[/]  " if result.ok else "[red]FAIL[/]"
        console.print(f"{mark} {result.name:<9} {result.detail}", highlight=False, soft_wrap=True)
    for warning in checks.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    failed = [r.name for r in results if not r.ok]
    console.print("dry run: nothing was started; " + (f"fix: {', '.join(failed)}" if failed else "ready to run"))
    return 2 if failed else 0
