"""Tandem against Hugging Face TRL's GRPOTrainer at a real model size (issue 28 item 1).

    PYTHONPATH=. .venv/bin/python benchmarks/real_size.py            # Qwen2.5-0.5B's shape (~20 GB, quiet machine!)
    PYTHONPATH=. .venv/bin/python benchmarks/real_size.py --size 1.5b
    PYTHONPATH=. .venv/bin/python benchmarks/real_size.py --quick    # the same path on a ~20M Qwen2, 2 steps

Needs TRL (the `bench` extra). In one invocation it builds a random-init checkpoint of the shape
(benchmarks/real_size_model.py: Qwen2ForCausalLM, tied, bf16 on disk), writes the 2-digit addition
task (benchmarks/rl_bench.py), and runs TRL and Tandem on them alternately (TRL, Tandem, TRL, ...
with --reps > 1), each in a fresh process, with one set of settings for both
(benchmarks/vs_trl_settings.py): GRPO, 4 prompts x 8 samples, 8 new tokens, k3 KL 0.01 to the
reference, fp32 training, one trainer rank and one generator; Tandem checkpoints every 2 steps.
Then, in the same invocation: a raw gloo broadcast of the bytes Tandem's publish sent, and a disk
write and read of the bytes of Tandem's checkpoint (benchmarks/raw_io.py), and (unless
--no-resume) Tandem resuming its first rep's run for one more step, its checkpoint evicted from
the page cache first. It prints, and writes to benchmarks/results/<date>-real-size[-SIZE].md
(benchmarks/real_size_report.py says what each figure is and where it comes from):

- seconds per step and per phase (Tandem: metrics.jsonl's time_*_s keys; TRL: generation, the
  rest of `_generate_and_score_completions`, the rest of the step, as benchmarks/vs_trl_trl.py times them);
- peak memory as PSS over each process tree, sampled every --sample-s from /proc/<pid>/smaps_rollup
  (benchmarks/proc_memory.py): TRL's tree; Tandem's whole tree and per service (trainer: torchrun
  and its ranks; generator: with vLLM's engine process; reward; coordinator: the rest);
- the publish (the step's phase, the coordinator's transport send, the trainer's broadcast)
  against the raw broadcast of the same bytes;
- the checkpoint: seconds a save, its bytes, the disk's write and read of those bytes, and the
  resume's load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from portable_args import without_paths
from proc_memory import ServiceLog, TreeSampler
from raw_io import broadcast_seconds, disk_seconds, evict
from real_size_model import SHAPES, directory_bytes
from real_size_report import Results, SystemRep, events, render, rep_line, tandem_rep
from rl_bench import ROOT, machine_line, run_tandem, write_task
from vs_trl import TANDEM_MODES
from vs_trl_settings import SharedSettings, tandem_overrides, trl_kwargs

SAVE_EVERY = 2
"""Tandem checkpoints every this many GRPO steps (issue 28's workload)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=["0.5b", "1.5b"], default="0.5b", help="the Qwen2.5 shape")
    p.add_argument("--quick", action="store_true", help="a ~20M Qwen2 of the same vocabulary, 2 steps, 1 rep")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps of each run")
    p.add_argument("--reps", type=int, default=1, help="runs per system, interleaved")
    p.add_argument("--systems", default="trl,tandem", help="comma-separated, in this order each rep: trl, tandem, "
                   "tandem-async")
    p.add_argument("--val", type=int, default=32, help="held-out prompts Tandem validates on before and after")
    p.add_argument("--sample-s", type=float, default=0.5, help="seconds between memory samples")
    p.add_argument("--broadcast-repeats", type=int, default=3)
    p.add_argument("--no-resume", action="store_true", help="skip the resume measurement")
    p.add_argument("--resumes", type=int, default=1, help="resumes of the first Tandem rep's run, each from the "
                   "same checkpoint in a fresh process")
    p.add_argument("--resume-reads", default="", help="comma-separated checkpointing.direct_io settings the "
                   "resumes alternate in ABBA order (direct, buffered); empty: the config's")
    p.add_argument("--tandem-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `tandem run` override for every Tandem run")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory, removed at the end")
    p.add_argument("--out", type=Path, default=None, help="the result file (default: benchmarks/results/<date>-...)")
    args = p.parse_args(argv)
    args.shape = "quick" if args.quick else args.size
    args.resume_reads = [r.strip() for r in args.resume_reads.split(",") if r.strip()]
    unknown = set(args.resume_reads) - {"direct", "buffered"}
    if unknown:
        p.error(f"--resume-reads takes direct and/or buffered, not {', '.join(sorted(unknown))}")
    if args.quick:
        args.steps, args.reps = 2, 1
    return args


def settings_for(steps: int) -> SharedSettings:
    """Issue 28's workload: 4 prompts x 8 samples, 8 new tokens, KL 0.01, fp32 (the rest: vs_trl's)."""
    return SharedSettings(num_prompts_per_step=4, num_generations=8, max_new_tokens=8, max_total_length=32,
                          kl_beta=0.01, num_steps=steps)


def build_model(shape: str, out_dir: Path) -> dict:
    """The checkpoint, built in a subprocess (this process never holds the model)."""
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "real_size_model.py"), str(out_dir),
                           "--size", shape], check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


class Bench:
    """One invocation's model, task and settings, and the runs of each system on them."""

    def __init__(self, args, work: Path, model_dir: Path):
        self.args, self.work, self.model_dir = args, work, model_dir
        self.task = write_task(work / "task", num_val=args.val)
        self.settings = settings_for(args.steps)

    def overrides(self, rep_dir: Path, extra: list[str]) -> list[str]:
        return tandem_overrides(self.settings, model_dir=str(self.model_dir), train_path=str(self.task.train_path),
                                val_path=str(self.task.val_path), num_val=len(self.task.val_rows),
                                log_dir=str(rep_dir), run_name="run") + [
            f"checkpointing.save_period={SAVE_EVERY}", "checkpointing.keep_top_k=1", *extra]

    def run_trl(self, rep_dir: Path) -> SystemRep:
        from vs_trl_trl import run_trl

        with TreeSampler(interval_s=self.args.sample_s, rest="trl") as sampler:
            figures = run_trl(trl_kwargs(self.settings, str(rep_dir / "trl_out")), self.model_dir,
                              self.task.train_path, rep_dir)
        shutil.rmtree(figures.final_dir, ignore_errors=True)
        command = f"PYTHONPATH=. {sys.executable} benchmarks/vs_trl_trl.py {rep_dir / 'trl_spec.json'}"
        return SystemRep("trl", figures.step_s, figures.phases, figures.startup_s, sampler.peaks, command=command)

    def run_tandem(self, system: str, rep_dir: Path) -> SystemRep:
        overrides = self.overrides(rep_dir, TANDEM_MODES[system] + self.args.tandem_override)
        rep_dir.mkdir(parents=True, exist_ok=True)
        services = ServiceLog(rep_dir / "run" / "logs" / "coordinator.log")
        with TreeSampler(services, interval_s=self.args.sample_s, rest="coordinator") as sampler:
            launched = run_tandem(overrides, rep_dir / "tandem.log")
        command = "PYTHONPATH=. " + shlex.join([sys.executable, "-m", "coordinator.cli.main", "run", *overrides])
        return tandem_rep(system, rep_dir / "run", launched, sampler.peaks, command)

    def resume(self, rep_dir: Path, system: str, reads: str = "") -> dict:
        """Resume the rep's run for one more step from its latest checkpoint, evicted from the
        page cache first (reads: "direct" or "buffered" sets checkpointing.direct_io): the
        resumed run's timings_s.resume_s (the trainer's load and the publish after it), that
        publish's seconds (the first `weights_published` it logged), the generator's reload and
        wait for bytes in it (its first `weights_swapped`), the resumed step's seconds and the
        process's wall seconds, launch to exit."""
        import json
        import time

        logs, summary_path = rep_dir / "run" / "logs", rep_dir / "run" / "summary.json"
        finished = rep_dir / "summary-of-the-run.json"  # the run's own: a resume finds it unfinished at step N + 1
        if not finished.exists():
            shutil.copy(summary_path, finished)
        shutil.copy(finished, summary_path)  # else the second resume finds the run finished and does nothing
        published_before = len(events(logs / "coordinator.log", "weights_published"))
        swapped_before = len(events(logs / "generator-0.log", "weights_swapped"))
        evict(rep_dir / "run" / "checkpoints")
        overrides = self.overrides(rep_dir, TANDEM_MODES[system] + self.args.tandem_override)
        if reads:
            overrides.append(f"checkpointing.direct_io={'true' if reads == 'direct' else 'false'}")
        overrides += [f"grpo.max_num_steps={self.settings.num_steps + 1}", "--resume"]
        launched = run_tandem(overrides, rep_dir / "tandem-resume.log")
        wall = time.time() - launched
        summary = json.loads(summary_path.read_text())
        published = events(logs / "coordinator.log", "weights_published")[published_before:]
        swapped = events(logs / "generator-0.log", "weights_swapped")[swapped_before:]
        rows = [json.loads(line) for line in (rep_dir / "run" / "metrics.jsonl").read_text().splitlines() if line]
        step = [r for r in rows if r.get("phase") == "grpo" and r.get("step") == self.settings.num_steps + 1]
        return {"reads": reads or "config", "resume_s": summary.get("timings_s", {}).get("resume_s"),
                "publish_s": float(published[0]["seconds"]) if published else None,
                "reload_s": swapped[0].get("reload_s") if swapped else None,
                "waited_s": swapped[0].get("waited_s") if swapped else None,
                "step_s": step[-1].get("time_step_s") if step else None, "wall_s": wall}


def resume_order(reads: list[str], count: int) -> list[str]:
    """`count` settings from `reads` in ABBA order (A B B A A B ...): each one as often first
    after the other as before it."""
    if not reads:
        return [""] * count
    order: list[str] = []
    while len(order) < count:
        order += reads if (len(order) // len(reads)) % 2 == 0 else reads[::-1]
    return order[:count]


def run_all(bench: Bench, results: Results) -> None:
    """Every rep of every system, interleaved; the resume after the first Tandem rep."""
    args = bench.args
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    for rep in range(args.reps):
        for system in systems:
            rep_dir = bench.work / f"{system}-{rep}"
            print(f"rep {rep + 1}/{args.reps}: {system} ...", flush=True)
            done = bench.run_trl(rep_dir) if system == "trl" else bench.run_tandem(system, rep_dir)
            results.reps.setdefault(system, []).append(done)
            print(f"  {rep_line(done)}", flush=True)
            if system != "trl":
                measure_checkpoint(bench, results, rep_dir, system)


def measure_checkpoint(bench: Bench, results: Results, rep_dir: Path, system: str) -> None:
    """Once: the checkpoint's bytes, the disk's write and read of as many, and the resume."""
    root = rep_dir / "run" / "checkpoints"
    if results.checkpoint_bytes is None and (root / "latest").is_file():
        results.checkpoint_bytes = directory_bytes(root / (root / "latest").read_text().strip())
        print(f"  checkpoint {results.checkpoint_bytes / 2**30:.2f} GiB; disk write and read of as many ...",
              flush=True)
        results.disk_s = disk_seconds(root, results.checkpoint_bytes)
        if not bench.args.no_resume:
            for i, setting in enumerate(resume_order(bench.args.resume_reads, bench.args.resumes)):
                print(f"  resume {i + 1}/{bench.args.resumes} for one more step (checkpoint evicted from the page "
                      f"cache{', reads ' + setting if setting else ''}) ...", flush=True)
                results.resumes.append(bench.resume(rep_dir, system, setting))
                print(f"    {results.resumes[-1]}", flush=True)
    shutil.rmtree(root, ignore_errors=True)


def measure_broadcast(bench: Bench, results: Results, model_info: dict) -> None:
    """The raw broadcast of the bytes Tandem published (without a Tandem run: the model's bf16 bytes)."""
    sent = [r.publish_bytes for runs in results.reps.values() for r in runs if r.publish_bytes]
    results.publish_bytes = sent[0] if sent else 2 * model_info["parameters"]
    print(f"raw gloo broadcast of {results.publish_bytes / 2**20:.0f} MiB between two processes ...", flush=True)
    results.broadcast_s = broadcast_seconds(results.publish_bytes, bench.args.broadcast_repeats)


def result_path(args, when: datetime.date) -> Path:
    if args.out is not None:
        return args.out
    suffix = "" if args.shape == "0.5b" else f"-{args.shape}"
    return ROOT / "benchmarks" / "results" / f"{when.isoformat()}-real-size{suffix}.md"


def _portable(argv: list[str]) -> list[str]:
    """The arguments without the paths of this machine (--work-dir, --out: they change no figure)."""
    return without_paths(argv, ("--work-dir", "--out"))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = "PYTHONPATH=. " + shlex.join([".venv/bin/python", "benchmarks/real_size.py",
                                            *_portable(argv if argv is not None else sys.argv[1:])])
    print(machine_line(), flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tandem-real-size-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        print(f"building a random-init {SHAPES[args.shape].name} checkpoint ...", flush=True)
        model_info = build_model(args.shape, work / "model")
        bench = Bench(args, work, work / "model")
        results = Results(machine=machine_line(), command=command, shape=SHAPES[args.shape], model=model_info,
                          settings=bench.settings, save_every=SAVE_EVERY)
        run_all(bench, results)
        measure_broadcast(bench, results, model_info)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    text = render(results)
    print("\n" + text)
    print("reproduce one run of each system (its files stay only with --work-dir):")
    for system, runs in results.reps.items():
        print(f"  {system}: {runs[0].command}")
    path = result_path(args, datetime.datetime.now(datetime.UTC).date())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
