"""What the integration tests of the step share: the run's services on 127.0.0.1 and the loop's
context over them, as a run wires them (`running_loop`, also the `start_loop` fixture for module
fixtures), on the embedded tiny model and arithmetic task unless told otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import structlog

from coordinator.data.examples import Example, read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.local import LocalCluster
from coordinator.loop.context import LoopContext
from tests import procs


@contextmanager
def running_loop(root: Path, cfg, *, model_dir: str | None = None, num_train: int = 500, num_val: int = 16,
                 examples: list[Example] | None = None, **connect) -> Iterator[tuple[LoopContext, LocalCluster]]:
    """Launch `cfg`'s services (LocalCluster, run directory root/run) and connect the loop's
    context to them: every service is stopped when the block ends. model_dir: default the
    embedded tiny model (cached under root/cache); examples: default the embedded task's
    training rows (num_train of them); `connect`: LoopContext.connect's keywords."""
    model_dir = model_dir or str(ensure_tiny_model(root / "cache"))
    tokens = Tokens(model_dir)
    if examples is None:
        train_path, _ = ensure_arithmetic_dataset(root / "cache", 0, num_train, num_val)
        examples = read_examples(train_path, cfg.data, tokens)
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = structlog.get_logger()
    cluster = LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log)
    with cluster as services:
        yield LoopContext.connect(cfg, services, tokens, examples, 0, log, **connect), cluster


@pytest.fixture(scope="session")
def start_loop():
    """`running_loop`, for module-scoped fixtures: `with start_loop(root, cfg) as (ctx, cluster): ...`."""
    return running_loop
