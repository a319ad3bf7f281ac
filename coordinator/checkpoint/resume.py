"""Exact resume: the coordinator's half of a loop checkpoint, and picking a run up from it.

The coordinator's state (`coordinator.json` beside the trainer's DCP shards) holds what the
steps after a resume depend on: the step, the weight version the generators served, the
GRPO cursor, the metric history (a mark of its rows in metrics.jsonl, not the rows:
coordinator/checkpoint/history.py), the phase (the warm start is done once GRPO checkpoints)
and the coordinator's RNG. Everything else the loop draws is a function of (seed, step):
sampling seeds, the cursor's shuffles. So with the trainer's model, optimizer and RNG
restored, the steps after a resume repeat those of an uninterrupted run.
"""

from __future__ import annotations

import base64
import json
import os
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coordinator.checkpoint import store
from coordinator.checkpoint.history import HistoryMark, checkpoint_lines


class NothingToResume(ValueError):
    """`--resume` was asked for a run that has no complete checkpoint."""


class RunFinished(NothingToResume):
    """`--resume` was asked for a run that finished all the GRPO steps the config asks for."""


@dataclass
class LoopState:
    step: int
    weight_version: int
    cursor: dict[str, int]
    history: HistoryMark | None = None
    """Which rows of metrics.jsonl are the checkpoint's history (None in a checkpoint written
    before checkpoints marked them: `metrics` holds them)."""
    metrics: list[dict] = field(default_factory=list)
    """The history's rows themselves, as older checkpoints held them: read, no longer written."""
    phase: str = "grpo"
    sft_steps: int = 0
    accuracy_before: float | None = None
    rng: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict:
        data = asdict(self)
        if not self.metrics:
            del data["metrics"]
        return data

    @classmethod
    def from_json(cls, data: dict) -> LoopState:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if fields.get("history") is not None:
            fields["history"] = HistoryMark.from_json(fields["history"])
        return cls(**fields)


def capture_rng() -> dict[str, object]:
    """The coordinator process's RNG (Python's and torch's CPU generator), JSON-safe."""
    import torch  # here, not at the top: a run launches its services before it imports torch

    version, state, gauss = random.getstate()
    return {"python": [version, list(state), gauss],
            "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}


def restore_rng(rng: dict[str, object]) -> None:
    if "python" in rng:
        version, state, gauss = rng["python"]
        random.setstate((version, tuple(state), gauss))
    if "torch" in rng:
        import torch

        raw = base64.b64decode(rng["torch"])
        torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def checkpoint_root(checkpoint_dir: str | None, run_dir: Path) -> Path:
    return Path(checkpoint_dir) if checkpoint_dir else run_dir / "checkpoints"


def find(root: Path) -> tuple[Path, LoopState]:
    """The latest complete checkpoint under root and its loop state, or NothingToResume."""
    path = store.latest(root)
    if path is None:
        raise NothingToResume(f"nothing to resume: no complete checkpoint under {root} (a run checkpoints every "
                              "checkpointing.save_period GRPO steps; start it without --resume)")
    return path, LoopState.from_json(json.loads((path / "coordinator.json").read_text()))


def history_lines(metrics_path: Path, checkpoint: Path, state: LoopState) -> list[str]:
    """The rows of the run's metrics.jsonl (`metrics_path`) that a resume from `checkpoint` keeps,
    as lines (MetricsLog.restore makes them the file and the history): those its mark counts
    (coordinator/checkpoint/history.py:checkpoint_lines, HistoryMismatch when the file does not hold
    them), or the rows an older checkpoint holds itself. Reads only: a resume calls it before it
    changes anything."""
    if state.history is None:
        return [json.dumps(row) for row in state.metrics]
    return checkpoint_lines(metrics_path, state.history, checkpoint)


def truncate_ledger(path: Path, step: int) -> None:
    """Keep the ledger's records (coordinator/loop/ledger.py) of steps up to `step`, the
    checkpoint's: the resumed run trains the later ones again (a missing file stays missing)."""
    if not path.is_file():
        return
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the process's death
        if row.get("step", step + 1) <= step:
            rows.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(rows))
    os.replace(tmp, path)


def find_for(cfg) -> tuple[Path, LoopState]:
    """The checkpoint `tandem run --resume` continues from: the run is named by logger.run_name."""
    if not cfg.logger.run_name:
        raise NothingToResume("--resume needs logger.run_name: the run to resume is <logger.log_dir>/<run_name>")
    run_dir = Path(cfg.logger.log_dir).resolve() / cfg.logger.run_name
    done = _finished_steps(run_dir / "summary.json")
    if done is not None and done >= cfg.grpo.max_num_steps:
        raise RunFinished(f"run {cfg.logger.run_name} has finished its {done} GRPO steps "
                          f"({run_dir / 'summary.json'}): there is nothing to resume, and nothing was changed. To "
                          f"train it further, raise grpo.max_num_steps above {done} and resume again")
    return find(checkpoint_root(cfg.checkpointing.checkpoint_dir, run_dir))


def _finished_steps(summary: Path) -> int | None:
    """The GRPO steps a finished run did (its summary.json), None if it did not finish."""
    try:
        return int(json.loads(summary.read_text()).get("grpo_steps", 0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError):
        return 0  # a summary that cannot be read: finished, with nothing known to extend


def find_unfinished(cfg) -> tuple[Path, LoopState] | None:
    """Automatic resume: the latest checkpoint of logger.run_name if that run has one and did
    not finish (no summary.json), else None (a fresh run)."""
    if not cfg.logger.run_name:
        return None
    run_dir = Path(cfg.logger.log_dir).resolve() / cfg.logger.run_name
    if (run_dir / "summary.json").is_file():
        return None
    try:
        return find(checkpoint_root(cfg.checkpointing.checkpoint_dir, run_dir))
    except NothingToResume:
        return None


def resume_version(checkpoint_version: int, served: Iterable[int]) -> int:
    """The version to publish a checkpoint's weights under: the checkpoint's own (so a resumed
    run repeats an uninterrupted one), unless something already serves or published a later
    version (generators that outlived the trainer or the coordinator refuse older versions):
    then the next version after it."""
    newest = max(served, default=checkpoint_version)
    return checkpoint_version if newest <= checkpoint_version else newest + 1
