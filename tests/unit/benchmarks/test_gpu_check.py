"""benchmarks/gpu_check.sh without a GPU: the dry run passes (plan, scripts, tiny checkpoint,
configs, gpu tests collected), the real run refuses a machine where nvidia-smi sees no GPU, and
the figures of a GRPO run are read from its metrics.jsonl and coordinator log."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from benchmarks.gpu_check import grpo_figures, plan

ROOT = Path(__file__).resolve().parents[3]


def test_dry_run_passes_on_cpu(tmp_path):
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run", "--work", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "dry run: every check passed" in proc.stdout
    for step in plan(tmp_path, dry_run=True):
        assert step.name in proc.stdout
    assert not (tmp_path / "results").exists()


def test_the_real_run_refuses_a_machine_without_a_gpu(tmp_path):
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "sees no GPU" in proc.stderr


def test_the_plan_covers_every_measurement_within_the_budget(tmp_path):
    names = [s.name for s in plan(tmp_path, dry_run=False)]
    for wanted in ("checkpoint 0.5b", "checkpoint 1.5b", "weight-sync smoke", "refit 0.5b",
                   "refit 1.5b", "grpo 3 steps colocated", "grpo 3 steps dedicated", "megatron 1-rank step",
                   "gpu tests"):
        assert any(n.startswith(wanted) for n in names), wanted
    assert all("--device" not in s.command or s.command[-1] == "cuda" for s in plan(tmp_path, dry_run=False))


def test_grpo_figures_come_from_metrics_and_the_coordinator_log(tmp_path):
    run = tmp_path / "20260101-000000-abcd"
    (run / "logs").mkdir(parents=True)
    rows = [{"phase": "val", "step": 0, "accuracy": 0.0},
            {"phase": "grpo", "step": 1, "loss": 0.5, "grad_norm": 1.0, "time_train_s": 2.0, "time_publish_s": 0.5,
             "reward_mean": 0.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "logs" / "coordinator.log").write_text(json.dumps(
        {"event": "weights_published", "version": 2, "cuda_ipc": True, "bytes": 2_000_000_000, "seconds": 0.5}) + "\n"
        + json.dumps({"event": "other"}) + "\n")
    figures = grpo_figures(tmp_path)
    assert figures["steps"] == [{"step": 1, "loss": 0.5, "grad_norm": 1.0, "time_train_s": 2.0, "time_publish_s": 0.5}]
    assert figures["weights_published"] == [{"version": 2, "seconds": 0.5, "bytes": 2_000_000_000, "cuda_ipc": True,
                                             "gb_per_s": 4.0}]
    assert "error" in grpo_figures(tmp_path / "empty")
