"""Recipe runs for the algorithm comparisons (benchmarks/distill_vs_grpo.py, benchmarks/ppo_vs_grpo.py):
one training run through the Python API, its summary cached in the output folder so that an
interrupted comparison resumes where it stopped, and its held-out curve."""

from __future__ import annotations

import json
import time
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "examples" / "configs"


def train(config, out: Path, name: str, **overrides) -> dict:
    """The summary of run `name` of `config` (a recipe path or dict) with `overrides`, trained
    unless out/<name>.summary.json exists; no checkpoints, TensorBoard or plots."""
    from coordinator.api import GRPOTrainer

    summary_path = out / f"{name}.summary.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    started = time.monotonic()
    summary = GRPOTrainer(config, **{"logger.log_dir": str(out / "runs"), "logger.run_name": name,
                                     "logger.tensorboard_enabled": False, "logger.plot_enabled": False,
                                     "checkpointing.enabled": False, **overrides}).train()
    summary["bench_wall_s"] = time.monotonic() - started
    summary_path.write_text(json.dumps(summary, default=str))
    return summary


def curve(summary: dict) -> dict[int, float]:
    """Held-out accuracy by step."""
    return {int(r["step"]): round(float(r["accuracy"]), 4) for r in summary["metrics"] if r["phase"] == "val"}
