"""Hugging Face exports of a run's model: at the end of every run (`<run>/hf/`), at each loop
checkpoint with `checkpointing.save_hf` (`<checkpoint>/hf/`), and of an existing run's
checkpoint afterwards (`tandem export RUN_DIR [--step N] OUT_DIR`: coordinator/run/export_run.py).

An export is the trainer's current weights as safetensors plus the source checkpoint's config,
tokenizer and generation config (trainer_svc/hf.py): what `AutoModelForCausalLM.from_pretrained`
(a reward model's: `AutoModelForSequenceClassification`) and vLLM load. It is written into a
temporary directory beside its final name and renamed into place, so a half-written export is
never found under the final name, and an earlier export there is replaced only once the new
one is complete.
"""

from __future__ import annotations

import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Export:
    path: Path
    num_tensors: int
    seconds: float


def export_hf(trainer, out_dir: Path, log) -> Export:
    """The trainer's weights as an HF checkpoint at `out_dir`, atomically (see the module docstring)."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.with_name(f".{out_dir.name}.partial-{secrets.token_hex(3)}")
    started = time.perf_counter()
    try:
        num_tensors = trainer.export_hf(str(partial))
        replace_dir(partial, out_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    export = Export(out_dir, num_tensors, time.perf_counter() - started)
    log.info("hf_exported", path=str(out_dir), tensors=num_tensors, seconds=round(export.seconds, 3))
    return export


def replace_dir(new: Path, final: Path) -> None:
    """Move `new` to `final`; an existing `final` is moved aside first and removed afterwards."""
    old = final.with_name(f".{final.name}.old-{secrets.token_hex(3)}") if final.exists() else None
    if old is not None:
        final.rename(old)
    new.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class NoCheckpoint(ValueError):
    """`tandem export` was given a run without the checkpoint asked for."""


def checkpoint_to_export(run_dir: Path, cfg, step: int | None) -> Path:
    """The run's checkpoint at `step` (None: its latest complete one), or NoCheckpoint."""
    from coordinator.checkpoint import store
    from coordinator.checkpoint.resume import checkpoint_root

    root = checkpoint_root(cfg.checkpointing.checkpoint_dir, run_dir)
    path = store.latest(root) if step is None else root / f"step_{step:06d}"
    if path is None or not (path / "coordinator.json").is_file():
        steps = sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "coordinator.json").is_file())
        raise NoCheckpoint(f"no complete checkpoint {'' if step is None else f'for step {step} '}under {root} "
                           f"(complete ones: {steps or 'none'}; runs checkpoint every checkpointing.save_period steps)")
    return path
