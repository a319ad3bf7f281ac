"""`tandem eval [CONFIG] [--model DIR | --checkpoint DIR] [overrides]`: the held-out accuracy
of a model (coordinator/run/eval_run.py), printed and kept in the run's summary.json."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from coordinator.config import ExperimentConfig


def evaluate(cfg: ExperimentConfig, checkpoint: Path | None, console: Console) -> int:
    from coordinator.cli.execute import execute
    from coordinator.metrics.sinks import SinkError
    from coordinator.run.eval_run import EvalRun

    try:
        run = EvalRun(cfg, console, checkpoint)
    except (ValueError, SinkError, PermissionError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    code, summary = execute(run, console)
    if summary is None:
        return code
    what = summary["checkpoint"] or summary["model"]
    console.print(f"[bold]held-out accuracy of {what}: {summary['accuracy']:.1%} ({summary['num_samples']} samples)[/]")
    console.print(f"summary: {summary['run_dir']}/summary.json  samples: {summary['run_dir']}/samples.jsonl")
    return 0
