"""curves.png: one column per training phase of the run (SFT, GRPO, DPO, RM), each against its
own step: the loss; reward and accuracy (training and held-out); the KL to the reference where
the phase has one. Axes are named, and the title is the run's name."""

from __future__ import annotations

from pathlib import Path

TRAINING_PHASES = {"sft": "SFT", "grpo": "GRPO", "dpo": "DPO", "rm": "RM"}
HELD_OUT = {"sft": "sft_val", "grpo": "val", "dpo": "val", "rm": "val"}
"""The phase whose rows hold each training phase's held-out checks."""


def _series(history: list[dict], phase: str, key: str) -> tuple[list[int], list[float]]:
    rows = [r for r in history if r["phase"] == phase and key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]


def _curves(history: list[dict], phase: str) -> dict[str, list[tuple[str, str, str]]]:
    """Panel -> [(label, row phase, key)] of what this phase's rows hold."""
    held_out = HELD_OUT[phase]
    panels = {
        "loss": [("training loss", phase, "loss")],
        "reward / accuracy": [("reward (mean)", phase, "reward_mean"), ("training accuracy", phase, "accuracy_train"),
                              ("pair accuracy", phase, "accuracy"), ("held-out accuracy", held_out, "accuracy")],
        "KL to the reference": [("KL", phase, "kl")],
    }
    return {name: [c for c in curves if _series(history, c[1], c[2])[0]] for name, curves in panels.items()}


def plot_run(history: list[dict], path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    fig = build_figure(history, title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def build_figure(history: list[dict], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [p for p in TRAINING_PHASES if any(r["phase"] == p for r in history)]
    if not phases:  # nothing trained (an evaluation, or a run stopped at once): the held-out checks alone
        phases = ["grpo"]
    curves = {p: _curves(history, p) for p in phases}
    rows = [name for name in next(iter(curves.values())) if any(curves[p][name] for p in phases)] or ["loss"]
    fig, axes = plt.subplots(len(rows), len(phases), figsize=(5.5 * len(phases), 2.8 * len(rows)), squeeze=False,
                             sharex="col")
    for column, phase in enumerate(phases):
        for row, panel in enumerate(rows):
            ax = axes[row][column]
            if not curves[phase][panel]:
                ax.axis("off")  # nothing of this kind in this phase (no KL in SFT)
                continue
            for label, source, key in curves[phase][panel]:
                steps, values = _series(history, source, key)
                style = "o-" if source != phase or len(steps) <= 30 else "-"
                ax.plot(steps, values, style, label=label, alpha=0.85, markersize=3)
            ax.set_ylabel(panel)
            ax.grid(alpha=0.3)
            if panel == "reward / accuracy" and all(0 <= v <= 1 for line in ax.lines for v in line.get_ydata()):
                ax.set_ylim(-0.02, 1.02)
            ax.legend(loc="best", fontsize=8)
            if row == 0:
                ax.set_title(TRAINING_PHASES[phase])
        lowest = max(row for row, panel in enumerate(rows) if curves[phase][panel] or row == 0)
        axes[lowest][column].set_xlabel(f"{TRAINING_PHASES[phase]} step")
        axes[lowest][column].tick_params(labelbottom=True)  # the panels below it are empty
    fig.suptitle(title)
    fig.tight_layout()
    return fig
