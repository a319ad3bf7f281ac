"""Where metrics go: a JSONL file (one line per step and phase), TensorBoard, and the
history kept for the loop checkpoint and the final plot."""

from __future__ import annotations

import json
import time
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool):
        self.path = run_dir / "metrics.jsonl"
        self.history: list[dict] = []
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        row = {"phase": phase, "step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                self._writer.add_scalar(f"{phase}/{key}", float(value), step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def plot_curves(history: list[dict], path: Path) -> Path:
    """PNG of the GRPO reward and the held-out accuracy against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in history if r["phase"] == "grpo" and "reward_mean" in r]
    val = [r for r in history if r["phase"] == "val"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([r["step"] for r in train], [r["reward_mean"] for r in train], label="train reward (mean)", alpha=0.7)
    if val:
        ax.plot([r["step"] for r in val], [r["accuracy"] for r in val], "o-", label="held-out accuracy")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Tandem GRPO")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
