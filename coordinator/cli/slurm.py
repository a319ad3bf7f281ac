"""`tandem slurm`: write a run's sbatch script into its run directory and, with --submit,
submit it (coordinator/launch/slurm.py says what the script does).

    tandem slurm [CONFIG.yaml] [section.key=value ...] [--submit]     the whole run as one job
    tandem slurm [CONFIG.yaml] logger.run_name=NAME --join K --submit  K more generators for NAME

The run directory (<logger.log_dir>/<logger.run_name>) must be on a file system every node
sees: the steps read the experiment, the token and the coordinator's address from it, and
write their logs and the checkpoints into it.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from coordinator.launch import slurm
from coordinator.run.paths import default_run_name, token_file


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tandem slurm", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=None, help="experiment YAML (default: the embedded demo)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. cluster.num_nodes=2")
    parser.add_argument("--submit", action="store_true", help="submit the script with sbatch (else only write it)")
    parser.add_argument("--join", type=int, default=0, metavar="K",
                        help="write a job of K more generators for the running run named by logger.run_name")
    parser.add_argument("--port", type=int, default=50051, help="the coordinator's port on the batch host")
    parser.add_argument("--rdzv-port", type=int, default=29400, help="torchrun's c10d rendezvous port on node 0")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--account", default=None)
    parser.add_argument("--time", dest="time_limit", default=None, help="job time limit (sbatch --time)")
    parser.add_argument("--cpus-per-generator", type=int, default=1, help="CPUs of each generator step")
    parser.add_argument("--no-requeue", dest="requeue", action="store_false",
                        help="do not let Slurm requeue the run (by default a requeued run resumes)")
    parser.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="ARG",
                        help="one more #SBATCH line, e.g. --sbatch-arg=--mem=200G (repeatable)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter on the nodes (default: this one)")
    args, extra = parser.parse_known_args(argv)
    if any(e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides += extra
    if args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    return args


def prepare(args: argparse.Namespace) -> tuple[Path, str]:
    """Validate the experiment, make the run directory and write the script; (script, run name)."""
    from coordinator.config import load_config

    # the services are Slurm's to place (as the containers' coordinator, cluster.launch=external): a
    # trainer filling its nodes' GPUs is fine, its generators get nodes of their own (slurm.plan)
    cfg = load_config(args.config, [*args.overrides, "cluster.launch=external"])
    layout = slurm.plan(cfg)
    name = cfg.logger.run_name
    if args.join and not name:
        raise slurm.SlurmPlanError("--join adds generators to a running run: name it with logger.run_name=NAME")
    name = name or default_run_name()
    run_dir = Path(cfg.logger.log_dir).resolve() / name
    (run_dir / "slurm" / "logs").mkdir(parents=True, exist_ok=True)
    token_file(run_dir)
    options = slurm.Options(
        run_name=name, run_dir=run_dir, python=args.python, workdir=Path.cwd(),
        config=Path(args.config).resolve() if args.config else None,
        overrides=(*args.overrides, f"logger.run_name={name}", f"logger.log_dir={run_dir.parent}"),
        port=args.port, rdzv_port=args.rdzv_port, partition=args.partition, account=args.account,
        time_limit=args.time_limit, cpus_per_generator=args.cpus_per_generator, requeue=args.requeue,
        sbatch_args=tuple(args.sbatch_args))
    if args.join:
        path = run_dir / "slurm" / f"join-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}.sbatch"
        path.write_text(slurm.join_script(layout, options, args.join))
    else:
        if options.config is not None:  # the run keeps its own copy: a requeue reads the same experiment
            shutil.copyfile(options.config, run_dir / "slurm" / "experiment.yaml")
        path = run_dir / "slurm" / "run.sbatch"
        path.write_text(slurm.run_script(layout, options))
    return path, name


def submit(script: Path) -> str:
    """sbatch the script; its job id."""
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SystemExit("error: sbatch not found: run on a Slurm login node (or drop --submit)") from None
    if done.returncode != 0:
        raise SystemExit(f"error: sbatch {script} failed:\n{done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def main(argv: list[str]) -> int:
    from coordinator.config import ConfigError

    args = parse_args(argv)
    try:
        script, name = prepare(args)
    except (ConfigError, slurm.SlurmPlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"script: {script}")
    if args.submit:
        job = submit(script)
        print(f"submitted job {job}: run {name}; logs under {script.parent / 'logs'}")
    return 0
