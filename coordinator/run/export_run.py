"""`tandem export RUN_DIR [--step N] OUT_DIR`: a run's loop checkpoint as a Hugging Face
checkpoint (coordinator/checkpoint/export.py says what an export holds)."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from coordinator.checkpoint.export import Export, NoCheckpoint, checkpoint_to_export, export_hf
from coordinator.config.run import Launch


def export_checkpoint(run_dir: Path, out_dir: Path, step: int | None) -> Export:
    """`tandem export`: start a trainer alone on the run's config, load the checkpoint into it and
    write it out as an HF checkpoint. The trainer works in <run>/exports/<name>, removed after;
    the log goes to <run>/logs/export.log."""
    from coordinator.config import load_config
    from coordinator.data.inputs import prepare_inputs
    from coordinator.launch.local import LocalCluster
    from coordinator.run.paths import token_file
    from tandem.logs import file_logger

    run_dir = Path(run_dir).resolve()
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise NoCheckpoint(f"{run_dir} is not a run directory (it has no config.yaml)")
    cfg = load_config(config)
    path = checkpoint_to_export(run_dir, cfg, step)
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"launch": Launch.LOCAL, "port": 0})})
    model_dir, _, _ = prepare_inputs(cfg)
    scratch = run_dir / "exports" / f"{path.name}-{secrets.token_hex(3)}"
    (scratch / "logs").mkdir(parents=True)
    try:
        with open(run_dir / "logs" / "export.log", "a") as log_file:
            log = file_logger("coordinator", log_file).bind(run_id=run_dir.name, checkpoint=str(path))
            with LocalCluster(cfg, model_dir, scratch, token_file(scratch).read_text(), log,
                              trainer_only=True) as services:
                services.trainer.load_checkpoint(str((path / "trainer").resolve()))
                return export_hf(services.trainer, out_dir, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
