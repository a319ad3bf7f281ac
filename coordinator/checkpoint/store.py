"""Loop checkpoints: <dir>/step_NNNNNN/{trainer/, coordinator.json[, hf/]}, written into a
temporary directory and renamed, so a checkpoint exists only once both parts are complete;
`latest` names the newest complete one; only the last K are kept."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def save(root: Path, step: int, state: dict, trainer, keep: int, log, *, save_hf: bool = False) -> Path:
    """save_hf: also the model as an HF checkpoint in <step>/hf (checkpointing.save_hf)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainer.save_checkpoint(str((tmp / "trainer").resolve()))
    if save_hf:
        trainer.export_hf(str((tmp / "hf").resolve()))  # complete when the step directory is renamed into place
    (tmp / "coordinator.json").write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / "latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint_saved", path=str(final), step=step)
    return final


def latest(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "coordinator.json").is_file() else None
