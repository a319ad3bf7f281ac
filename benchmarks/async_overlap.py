"""Synchronous against asynchronous GRPO in Tandem: does the async step cost only its slower engine?

    PYTHONPATH=. .venv/bin/python benchmarks/async_overlap.py              # 60 steps, 2 reps per mode (quiet machine!)
    PYTHONPATH=. .venv/bin/python benchmarks/async_overlap.py --quick      # smoke check: 3 steps, 1 rep

On the embedded task (2-digit addition, the tiny Llama SFT-warmed once with transformers, as
benchmarks/vs_trl.py does, cached) it runs `tandem run` with the embedded demo's GRPO settings,
alternately synchronous and asynchronous (`grpo.async_grpo.enabled=true`,
`max_trajectory_age_steps=1`; async needs dedicated generators and
`loss_fn.use_importance_sampling_correction=true`, both the defaults), each rep a fresh run.

From each step's row of metrics.jsonl (coordinator/algorithms/grpo.py, coordinator/loop/pipeline.py):
step = wall time between consecutive rows; generation = `time_rollout_s` (the producer's rollout
and scoring of the step's batch, whenever it ran); training = `time_advantages_s` +
`time_train_s` (the trainer's step, previous/reference logprobs included); publish =
`time_publish_s` (async: only handing the version over, the broadcast runs detached); wait =
`time_rollout_wait_s` (how long the step waited for its batch). It prints the medians (steps
after the first), step / max(generation, training) (1.0 = perfect overlap; the synchronous step
is about generation + training + publish), the trajectory ages and the held-out accuracy after
GRPO (Tandem's greedy validation, the same for both modes).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_bench import (
    ensure_sft_checkpoint,
    machine_line,
    median,
    read_metrics,
    run_tandem,
    tandem_figures,
    write_task,
)

PHASES = {"generation": ("time_rollout_s",), "training": ("time_advantages_s", "time_train_s"),
          "publish": ("time_publish_s",), "wait": ("time_rollout_wait_s",)}
MODES = {
    "sync": ["grpo.async_grpo.enabled=false"],
    "async": ["grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1",
              "policy.generation.colocated.enabled=false", "loss_fn.use_importance_sampling_correction=true"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=2, help="runs per mode, interleaved sync/async")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sft-target", type=float, default=0.45)
    p.add_argument("--quick", action="store_true", help="smoke check: 3 steps, 1 rep")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `tandem run` override for every rep (e.g. cluster.num_generators=2)")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory, removed at the end")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.steps = 1, 3
    return args


def base_overrides(model_dir: Path, task, steps: int, run_dir: Path) -> list[str]:
    """The embedded demo's GRPO from the warm-started checkpoint; validation before and after only."""
    return [f"policy.model_name={model_dir}", "data.dataset_name=jsonl", f"data.train_path={task.train_path}",
            f"data.val_path={task.val_path}", "sft.max_num_steps=0", f"grpo.max_num_steps={steps}",
            "grpo.val_period=0", "checkpointing.enabled=false", f"logger.log_dir={run_dir.parent}",
            f"logger.run_name={run_dir.name}", "logger.tensorboard_enabled=false", "logger.plot_enabled=false"]


def run_mode(mode: str, overrides: list[str], run_dir: Path) -> dict:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    launched = run_tandem(overrides, run_dir.parent / f"{run_dir.name}.log")
    figures = tandem_figures(run_dir, launched, PHASES)
    steps = [r for r in read_metrics(run_dir) if r["phase"] == "grpo"]
    later = steps[1:] or steps
    ph = figures.phases
    return {"mode": mode, "step": figures.median_step_s, **ph,
            "overlap": figures.median_step_s / max(ph["generation"], ph["training"]),
            "age_mean": median([r.get("trajectory_age_mean", 0.0) for r in later]),
            "dropped": sum(r.get("stale_groups_dropped", 0.0) for r in steps),
            "accuracy_before": figures.extra["tandem_accuracy_before"],
            "accuracy_after": figures.extra["tandem_accuracy_after"], "startup": figures.startup_s,
            "command": shlex.join([sys.executable, "-m", "coordinator.cli.main", "run", *overrides])}


def print_table(results: list[dict]) -> None:
    print(f"\n{'mode':<6} {'step':>6} {'gen':>6} {'train':>6} {'publish':>7} {'wait':>6} "
          f"{'step/max(gen,train)':>19} {'age':>5} {'dropped':>7} {'held-out before -> after':>25} {'start-up':>8}")
    for r in results:
        print(f"{r['mode']:<6} {r['step']:>6.3f} {r['generation']:>6.3f} {r['training']:>6.3f} {r['publish']:>7.3f} "
              f"{r['wait']:>6.3f} {r['overlap']:>19.2f} {r['age_mean']:>5.2f} {r['dropped']:>7.0f} "
              f"{r['accuracy_before']:>14.3f} -> {r['accuracy_after']:.3f} {r['startup']:>8.1f}")
    for mode in MODES:
        mine = [r for r in results if r["mode"] == mode]
        if mine:
            print(f"{mode}: median step {median([r['step'] for r in mine]):.3f} s, step/max(gen,train) "
                  f"{median([r['overlap'] for r in mine]):.2f}, held-out after "
                  + ", ".join(f"{r['accuracy_after']:.3f}" for r in mine))
    print("(seconds per step, medians over the steps after the first)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(machine_line())
    print("command: PYTHONPATH=. " + shlex.join([sys.executable, "benchmarks/async_overlap.py", *(argv or sys.argv[1:])]))
    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tandem-async-overlap-"))
    results = []
    try:
        task = write_task(work / "task")
        model_dir, accuracy, sft_steps = ensure_sft_checkpoint(ensure_tiny_model(cache_root()), task, args.sft_target)
        print(f"start checkpoint: {model_dir.name} (SFT {sft_steps} steps, held-out {accuracy:.3f}); {args.steps} "
              f"GRPO steps per run", flush=True)
        for rep in range(args.reps):
            for mode, keys in MODES.items():
                run_dir = work / "runs" / f"{mode}-{rep}"
                print(f"  rep {rep + 1}/{args.reps}: {mode} ...", flush=True)
                results.append(run_mode(mode, base_overrides(model_dir, task, args.steps, run_dir) + keys
                                        + args.override, run_dir))
        print_table(results)
        print("\nreproduce one run of each mode (its files stay only with --work-dir):")
        for mode in MODES:
            print(f"  {mode}: PYTHONPATH=. " + next(r["command"] for r in results if r["mode"] == mode))
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
