"""Start-up of `tandem run` on the embedded demo: from the command to its services being up
(what the run prints as "services up in X s") and to the end of its first GRPO step, with
vLLM's caches warm (kept in $TANDEM_HOME/vllm across runs, the default), cold (removed
before the run), and warm with vLLM's engine process spawned instead of forked
(`vllm_cfg.cpu_engine_start=spawn`, vLLM's own choice on CPU), interleaved:

    .venv/bin/python benchmarks/startup.py --repeats 3

Each run is `tandem run` with no warm start and one GRPO step, in a subprocess; the figures
come from its summary.json (timings_s.startup_s) and metrics.jsonl (the first GRPO row's
time, against the command's start). The embedded model and data are built once first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = ["sft.max_num_steps=0", "grpo.max_num_steps=1", "grpo.val_at_start=false", "grpo.val_period=0",
       "grpo.max_val_samples=8", "checkpointing.enabled=false", "logger.plot_enabled=false",
       "logger.tensorboard_enabled=false"]


MODES = {"warm": [], "cold": [], "warm, spawn": ["policy.generation.vllm_cfg.cpu_engine_start=spawn"]}
"""Variant -> its extra overrides ("cold" removes vLLM's caches first)."""


def _run(home: Path, runs: Path, name: str, extra: list[str]) -> tuple[float, float, float]:
    """(services up, first GRPO step done, whole command) in seconds, for one `tandem run`."""
    env = {**os.environ, "TANDEM_HOME": str(home)}
    env.pop("TANDEM_TOKEN", None)
    started_wall, started = time.time(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "coordinator.cli.main", "run", *RUN, *extra, f"logger.log_dir={runs}",
                    f"logger.run_name={name}"], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    total = time.perf_counter() - started
    summary = json.loads((runs / name / "summary.json").read_text())
    rows = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
    first_step = min(r["time"] for r in rows if r["phase"] == "grpo") - started_wall
    return summary["timings_s"]["startup_s"], first_step, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tandem-startup-"))
    home, runs = root / "home", root / "runs"
    try:
        _run(home, runs, "prepare", [])  # builds the embedded model and data, and warms vLLM's caches
        figures: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
        for index in range(args.repeats):
            order = list(MODES)[index % len(MODES):] + list(MODES)[:index % len(MODES)]
            for number, mode in enumerate(order):
                if mode == "cold":
                    shutil.rmtree(home / "vllm", ignore_errors=True)
                figures[mode].append(_run(home, runs, f"{index}-{number}", MODES[mode]))
        print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
        print(f"{'vLLM':<12} {'services up':>12} {'first step':>12} {'command':>10}   (median of {args.repeats})")
        for mode, rows in figures.items():
            up, first, total = (statistics.median(column) for column in zip(*rows))
            print(f"{mode:<12} {up:11.1f}s {first:11.1f}s {total:9.1f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
