"""The `tandem` command.

    tandem run [CONFIG.yaml] [section.key=value ...]   run an experiment (default: the embedded demo)
    tandem run [CONFIG.yaml] --resume [...]   continue logger.run_name from its latest checkpoint
        (without --resume, a run named by logger.run_name that has a checkpoint and did not
        finish is resumed too: re-running the same command after a crash continues it)
    tandem run [CONFIG.yaml] --dry-run [...]   check the config, data, model and engines; start nothing
    tandem config [CONFIG.yaml] [...]   print the resolved config, each key with its source
    tandem eval [CONFIG.yaml] [--model DIR | --checkpoint DIR] [...]   held-out accuracy, no training
    tandem status [--coordinator HOST:PORT | --run-dir DIR]   live services and progress of a run
    tandem export RUN_DIR OUT_DIR [--step N]   a run's checkpoint (default: its latest) as an HF checkpoint
    tandem slurm [CONFIG.yaml] [...] [--submit]   the run as a Slurm job (coordinator/cli/slurm.py)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape


def _console(stderr: bool = True) -> Console:
    """Rich output; off a terminal, lines are not wrapped at 80 columns (logs, pipes, CI)."""
    console = Console(stderr=stderr)
    console.soft_wrap = not console.is_terminal
    if not console.is_terminal:  # third-party progress bars (model saving, downloads) are for terminals
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return console


def _load(args: argparse.Namespace, console: Console):
    """The experiment config, or None after printing the error."""
    from coordinator.config import ConfigError, load_config

    try:
        return load_config(args.config, args.overrides)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return None


def _run(args: argparse.Namespace) -> int:
    console = _console()
    cfg = _load(args, console)
    if cfg is None:
        return 2
    if args.dry_run:
        from coordinator.cli.dry_run import dry_run

        return dry_run(cfg, console)
    from coordinator.checkpoint.resume import NothingToResume, RunFinished
    from coordinator.metrics.sinks import SinkError
    from coordinator.run.create import create_run

    try:
        run = create_run(cfg, console, resume=True if args.resume else None)  # None: resume an unfinished run
    except RunFinished as exc:
        console.print(escape(str(exc)))
        return 0
    except (NothingToResume, ValueError, SinkError, PermissionError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    from coordinator.cli.execute import execute

    code, summary = execute(run, console)
    if summary is None:
        return code
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    if before is not None and after is not None:
        console.print(f"[bold]held-out accuracy: {before:.1%} before GRPO -> {after:.1%} after "
                      f"({(after - before) * 100:+.1f} points)[/]")
    console.print(f"wall time {summary['wall_time_s']:.0f}s; summary: {summary['run_dir']}/summary.json")
    if "plot" in summary:
        console.print(f"plot: {summary['plot']}")
    console.print(f"logs: {summary['run_dir']}/logs/  metrics: {summary['run_dir']}/metrics.jsonl")
    return 0


def _config(args: argparse.Namespace) -> int:
    console = _console()
    cfg = _load(args, console)
    if cfg is None:
        return 2
    from coordinator.cli.config_cmd import annotated_config

    print(annotated_config(cfg, args.config, args.overrides), end="")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from coordinator.cli.eval_cmd import evaluate

    console = _console()
    if args.model:
        args.overrides.append(f"policy.model_name={args.model}")
    cfg = _load(args, console)
    return 2 if cfg is None else evaluate(cfg, args.checkpoint, console)


def _status(args: argparse.Namespace) -> int:
    from coordinator.cli.status import show_status

    return show_status(args.coordinator, args.run_dir, _console(stderr=False))


def _export(args: argparse.Namespace) -> int:
    from coordinator.checkpoint.export import NoCheckpoint
    from coordinator.config import ConfigError
    from coordinator.launch.launcher import ServiceDied
    from coordinator.run.export_run import export_checkpoint

    console = _console()
    try:
        with console.status(f"exporting {args.run_dir} (starting its trainer)..."):
            export = export_checkpoint(Path(args.run_dir), Path(args.out_dir), args.step)
    except (NoCheckpoint, ConfigError, ServiceDied, TimeoutError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2 if isinstance(exc, (NoCheckpoint, ConfigError)) else 1
    console.print(f"exported {export.num_tensors} tensors to {export.path} in {export.seconds:.1f}s")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="Tandem: RL post-training as services")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in [("run", "run an experiment (no CONFIG: the embedded tiny-model demo)"),
                       ("config", "print the resolved config with each key's source (default, file, override)"),
                       ("eval", "held-out accuracy of a model or checkpoint, no training")]:
        command = sub.add_parser(name, help=text)
        command.add_argument("config", nargs="?", default=None, help="experiment YAML (NeMo-RL schema)")
        command.add_argument("overrides", nargs="*", help="dotted overrides, e.g. grpo.max_num_steps=10")
        if name == "run":
            command.add_argument("--resume", action="store_true",
                                 help="continue the run named by logger.run_name from its latest complete checkpoint")
            command.add_argument("--dry-run", action="store_true", help="check the config, data files, model and "
                                 "engine support; start nothing")
        if name == "eval":
            command.add_argument("--model", default=None, help="HF checkpoint directory (policy.model_name)")
            command.add_argument("--checkpoint", type=Path, default=None,
                                 help="a loop checkpoint (runs/<run>/checkpoints/step_N) or an HF checkpoint directory")
    sub.add_parser("slurm", help="write (and --submit) the run's sbatch script; `tandem slurm -h` for more")
    export = sub.add_parser("export", help="write a run's checkpoint as a Hugging Face checkpoint")
    export.add_argument("run_dir", help="the run's directory (logger.log_dir/logger.run_name)")
    export.add_argument("out_dir", help="where the HF checkpoint goes (replaced once the new one is complete)")
    export.add_argument("--step", type=int, default=None, help="the GRPO step's checkpoint (default: the latest)")
    status = sub.add_parser("status", help="show a running experiment's services and progress")
    status.add_argument("--coordinator", default=None, help="host:port of the coordinator")
    status.add_argument("--run-dir", type=Path, default=None, help="run directory (reads its coordinator.addr)")
    return parser


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["slurm"]:  # its own flags: coordinator/cli/slurm.py
        from coordinator.cli.slurm import main as slurm_main

        return slurm_main((sys.argv[1:] if argv is None else argv)[1:])
    parser = _parser()
    args, extra = parser.parse_known_args(argv)  # overrides may follow a flag: `run CFG --resume a.b=c`
    takes_overrides = args.command in ("run", "config", "eval")
    if not takes_overrides and extra or any(e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if takes_overrides:
        args.overrides += extra
        if args.config and "=" in args.config:
            args.overrides.insert(0, args.config)  # `tandem run a.b=c` with no file
            args.config = None
    return {"run": _run, "config": _config, "eval": _eval, "status": _status, "export": _export}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
