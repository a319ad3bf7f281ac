"""Tandem against Hugging Face TRL's GRPOTrainer on the same checkpoint, data and settings.

    PYTHONPATH=. .venv/bin/python benchmarks/vs_trl.py                 # both cases, 2 reps each (quiet machine!)
    PYTHONPATH=. .venv/bin/python benchmarks/vs_trl.py --quick         # smoke check: few steps, 1 rep
    PYTHONPATH=. .venv/bin/python benchmarks/vs_trl.py --cases tiny --reps 3 --steps 60

Needs TRL (`pip install -e '.[bench]'`). In one invocation it writes the task (the embedded
2-digit addition, coordinator/embedded/arithmetic.py, 6000 train / 500 held-out rows), builds
each case's start checkpoint once, and runs TRL and Tandem from it alternately (TRL, Tandem,
TRL, Tandem, ...), each rep in a fresh process (`tandem run` for Tandem), Tandem both synchronous ("tandem") and
asynchronous ("tandem-async": grpo.async_grpo with max_trajectory_age_steps 1, which needs the
importance-sampling correction by the generator's logprobs; benchmarks/async_overlap.py's settings):

- tiny: the embedded tiny Llama (~1M parameters), SFT-warmed with plain transformers to ~45-50%
  held-out accuracy, 4 new tokens;
- heavy: a ~25M-parameter Llama (random init, the same character vocabulary), 64 new tokens,
  where batched generation should matter more.

Both with 16 prompts x 8 samples a step, temperature 1, token-level loss, clip 0.2, k3 KL 0.04,
AdamW lr 1e-5 constant, fp32 (benchmarks/vs_trl_settings.py maps every setting to both).
Per case it prints, per system: greedy held-out accuracy before and after (the same
transformers code scores every final model: TRL's saved model, Tandem's last checkpoint), the
median seconds per step (steps after the first), completions/s and completion tokens/s,
start-up (TRL: process launch to its first step; Tandem: `tandem run` to its first GRPO step,
which includes its held-out validation before GRPO) and the median phase times, then each
Tandem mode's ratio of completions/s to TRL's. Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_overlap import MODES
from rl_bench import (
    RunFigures,
    Task,
    build_heavy_model,
    ensure_sft_checkpoint,
    evaluate_dir,
    greedy_accuracy,
    load_tandem_final,
    machine_line,
    median,
    run_tandem,
    tandem_figures,
    write_task,
)
from vs_trl_settings import SharedSettings, tandem_overrides, trl_kwargs

TANDEM_MODES = {"tandem": MODES["sync"], "tandem-async": MODES["async"]}
"""Tandem's systems in the comparison, as the overrides each adds to the shared settings'."""

TANDEM_PHASES = {"generate": ("time_rollout_s",), "train": ("time_advantages_s", "time_train_s"),
                 "publish": ("time_publish_s",)}
"""Tandem's per-step phase timings (metrics.jsonl keys of coordinator/algorithms/grpo.py)."""


@dataclass
class Case:
    name: str
    settings: SharedSettings
    model_dir: Path
    task: Task
    accuracy_before: float
    note: str


@dataclass
class Rep:
    figures: RunFigures
    accuracy_after: float
    command: str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="tiny,heavy", help="comma-separated: tiny, heavy")
    p.add_argument("--reps", type=int, default=2, help="runs per system and case, interleaved")
    p.add_argument("--steps", type=int, default=60, help="GRPO steps of the tiny case")
    p.add_argument("--heavy-steps", type=int, default=10, help="GRPO steps of the heavy case (~tens of s each)")
    p.add_argument("--heavy-new-tokens", type=int, default=64)
    p.add_argument("--heavy-val", type=int, default=100, help="held-out prompts scored in the heavy case")
    p.add_argument("--sft-target", type=float, default=0.45, help="tiny case: SFT until held-out accuracy >= this")
    p.add_argument("--quick", action="store_true", help="smoke check: 3 tiny / 2 heavy steps, 1 rep")
    p.add_argument("--systems", default="trl,tandem,tandem-async",
                   help="comma-separated, run in this order each rep: trl, tandem, tandem-async")
    p.add_argument("--tandem-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `tandem run` override for every Tandem rep (e.g. cluster.trainer_ranks=2)")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory, removed at the end")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.heavy_steps = 1, 3, 2
    return args


def prepare_tiny(args, work: Path) -> Case:
    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model

    task = write_task(work / "task")
    model_dir, _, steps = ensure_sft_checkpoint(ensure_tiny_model(cache_root()), task, args.sft_target)
    settings = SharedSettings(num_steps=args.steps)
    before = evaluate_dir(model_dir, task.val_rows, settings.max_new_tokens)
    return Case("tiny", settings, model_dir, task, before,
                f"embedded tiny Llama, SFT-warmed {steps} steps with transformers ({model_dir.name}, cached)")


def prepare_heavy(args, work: Path) -> Case:
    full = write_task(work / "task")
    task = write_task(work / "task-heavy", num_val=args.heavy_val)
    task = Task(full.train_path, task.val_path, task.val_rows)  # the same training rows as the tiny case
    params = build_heavy_model(work / "heavy")
    settings = SharedSettings(num_steps=args.heavy_steps, max_new_tokens=args.heavy_new_tokens, max_total_length=128)
    before = evaluate_dir(work / "heavy", task.val_rows, settings.max_new_tokens)
    return Case("heavy", settings, work / "heavy", task, before,
                f"random-init Llama, {params / 1e6:.1f}M parameters, {settings.max_new_tokens} new tokens")


def run_trl_rep(case: Case, rep_dir: Path) -> Rep:
    from vs_trl_trl import run_trl

    figures = run_trl(trl_kwargs(case.settings, str(rep_dir / "trl_out")), case.model_dir, case.task.train_path,
                      rep_dir)
    accuracy = evaluate_dir(figures.final_dir, case.task.val_rows, case.settings.max_new_tokens)
    shutil.rmtree(figures.final_dir, ignore_errors=True)
    command = f"{sys.executable} benchmarks/vs_trl_trl.py {rep_dir / 'trl_spec.json'}"
    return Rep(figures, accuracy, command)


def run_tandem_rep(case: Case, rep_dir: Path, extra: list[str]) -> Rep:
    overrides = tandem_overrides(case.settings, model_dir=str(case.model_dir), train_path=str(case.task.train_path),
                                 val_path=str(case.task.val_path), num_val=len(case.task.val_rows),
                                 log_dir=str(rep_dir), run_name="run") + extra
    rep_dir.mkdir(parents=True, exist_ok=True)
    launched = run_tandem(overrides, rep_dir / "tandem.log")
    figures = tandem_figures(rep_dir / "run", launched, TANDEM_PHASES)
    model, tokenizer = load_tandem_final(case.model_dir, rep_dir / "run")
    accuracy = greedy_accuracy(model, tokenizer, case.task.val_rows, case.settings.max_new_tokens)
    shutil.rmtree(rep_dir / "run" / "checkpoints", ignore_errors=True)
    command = shlex.join([sys.executable, "-m", "coordinator.cli.main", "run", *overrides])
    return Rep(figures, accuracy, command)


def run_case(case: Case, args, work: Path) -> dict[str, list[Rep]]:
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    reps: dict[str, list[Rep]] = {name: [] for name in systems}
    for rep in range(args.reps):  # A/B/A/B
        for system in systems:
            rep_dir = work / case.name / f"{system}-{rep}"
            print(f"  {case.name} rep {rep + 1}/{args.reps}: {system} ...", flush=True)
            done = (run_trl_rep(case, rep_dir) if system == "trl"
                    else run_tandem_rep(case, rep_dir, TANDEM_MODES[system] + args.tandem_override))
            reps[system].append(done)
            print(f"    {_rep_line(case, done)}", flush=True)
    return reps


def _rep_line(case: Case, rep: Rep) -> str:
    f = rep.figures
    phases = " ".join(f"{k} {v:.3f}" for k, v in f.phases.items())
    extra = " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in f.extra.items())
    return (f"held-out {case.accuracy_before:.3f} -> {rep.accuracy_after:.3f}; median {f.median_step_s:.3f} s/step "
            f"(first {f.step_s[0]:.2f} s); start-up {f.startup_s:.1f} s; completion {f.completion_tokens:.1f} "
            f"tokens; phases/step: {phases}; {extra}")


def print_table(case: Case, reps: dict[str, list[Rep]]) -> None:
    s = case.settings
    print(f"\n{case.name}: {case.note}; {s.num_prompts_per_step} prompts x {s.num_generations} samples, "
          f"{s.num_steps} steps, {len(case.task.val_rows)} held-out prompts")
    print(f"{'system':<12} {'held-out before -> after (per rep)':<36} {'s/step':>7} {'compl/s':>8} {'tok/s':>8} "
          f"{'start-up s':>10}  median phases s/step")
    rates = {}
    for system, runs in reps.items():
        step = median([r.figures.median_step_s for r in runs])
        rates[system] = s.samples_per_step / step
        tokens = rates[system] * median([r.figures.completion_tokens for r in runs])
        after = ", ".join(f"{r.accuracy_after:.3f}" for r in runs)
        phases = {k: median([r.figures.phases.get(k, float("nan")) for r in runs]) for k in runs[0].figures.phases}
        startup = median([r.figures.startup_s for r in runs])
        print(f"{system:<12} {f'{case.accuracy_before:.3f} -> {after}':<36} {step:>7.3f} {rates[system]:>8.1f} "
              f"{tokens:>8.0f} {startup:>10.1f}  " + " ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    for system in (name for name in rates if name != "trl" and "trl" in rates):
        print(f"{system}/TRL completions/s: {rates[system] / rates['trl']:.2f}x")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(machine_line())
    print("command: PYTHONPATH=. " + shlex.join([sys.executable, "benchmarks/vs_trl.py", *(argv or sys.argv[1:])]))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tandem-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare = {"tiny": prepare_tiny, "heavy": prepare_heavy}
    results = []
    try:
        for name in [c.strip() for c in args.cases.split(",") if c.strip()]:
            case = prepare[name](args, work)
            print(f"{name}: {case.note}; held-out accuracy of the start checkpoint {case.accuracy_before:.3f}",
                  flush=True)
            reps = run_case(case, args, work)
            results.append((case, reps))
            print_table(case, reps)
        print("\nreproduce one rep of each system (its files stay only with --work-dir):")
        for case, reps in results:
            for system, runs in reps.items():
                print(f"  {case.name} {system}: PYTHONPATH=. {runs[0].command}")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    if len(results) > 1:
        print("\nsummary")
        for case, reps in results:
            print_table(case, reps)


if __name__ == "__main__":
    main()
