"""What a run starts from: its directory, its token, and its model and data files (built once
and cached for the embedded defaults)."""

from __future__ import annotations

import secrets
from datetime import datetime
from pathlib import Path

from coordinator.config import ExperimentConfig
from coordinator.data.sources import data_source
from coordinator.embedded.cache import cache_root
from tandem.rpc import TokenMissing, load_token


def default_run_name() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def make_run_dir(cfg: ExperimentConfig) -> Path:
    name = cfg.logger.run_name or default_run_name()
    run_dir = Path(cfg.logger.log_dir).resolve() / name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    return run_dir


def prepare_inputs(cfg: ExperimentConfig) -> tuple[str, Path, Path | None]:
    """The model directory and the train/val files (the data source builds the embedded ones if
    asked: the arithmetic task, or its toy preference pairs for DPO/RM)."""
    model_dir = cfg.policy.model_name
    if model_dir is None:
        from coordinator.embedded.tiny_model import ensure_tiny_model

        model_dir = str(ensure_tiny_model(cache_root()))
    train, val = data_source(cfg.data).files(cfg.data)
    return model_dir, train, val


def run_token(run_dir: Path) -> str:
    """The shared token: TANDEM_TOKEN/TANDEM_TOKEN_FILE if set, else the run's own (token_file),
    so `tandem status` can read it and a restarted coordinator speaks to the services that
    outlived the previous one."""
    try:
        return load_token()
    except TokenMissing:
        return token_file(run_dir).read_text().strip()


def token_file(run_dir: Path) -> Path:
    """<run>/token (mode 0600), made once with a fresh token."""
    path = run_dir / "token"
    if not (path.is_file() and path.read_text().strip()):
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(secrets.token_hex(16))
    return path
