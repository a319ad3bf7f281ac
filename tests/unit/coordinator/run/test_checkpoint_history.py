"""A loop checkpoint and the run's metric history (coordinator/run/grpo_run.py, checkpoint and
_restore), without services: the coordinator's state a checkpoint saves keeps the same size
however long the run (it marks the rows of metrics.jsonl that are its own, it does not copy
them), and a resume rebuilds exactly those rows from metrics.jsonl, dropping the ones logged
after the checkpoint. A checkpoint written before the mark, with the rows in it, still resumes;
a resume whose metrics.jsonl is gone stops before any service starts."""

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from coordinator.config import load_config
from coordinator.run.grpo_run import Run


class _Trainer:
    """Writes its part of a checkpoint at once; loads one by noting it."""

    def __init__(self):
        self.loaded: list[str] = []

    def save_checkpoint(self, path: str, *, background: bool = False) -> int:
        Path(path).mkdir(parents=True)
        return 1

    def checkpoint_written(self, path: str, timeout_s: float) -> bool:
        return True

    def load_checkpoint(self, path: str) -> None:
        self.loaded.append(path)


class _Ctx:
    """What Run.checkpoint and Run._restore use of the loop's context: no generators to publish to."""

    def __init__(self):
        self.publisher = SimpleNamespace(version=0)
        self.services = SimpleNamespace(trainer=_Trainer(), critic=None, all_generators=list)

    def publish(self, generators=None, *, version=None) -> None:
        self.publisher.version = version if version is not None else self.publisher.version + 1


def _run(root: Path, **kwargs) -> Run:
    cfg = load_config(overrides=[f"logger.log_dir={root}", "logger.run_name=r", "logger.tensorboard_enabled=false",
                                 "logger.plot_enabled=false", "checkpointing.save_period=1",
                                 "checkpointing.keep_top_k=2"])
    return Run(cfg, Console(file=io.StringIO()), **kwargs)


def _steps(run: Run, ctx: _Ctx, first: int, last: int, *, checkpoint_at=()) -> None:
    """GRPO steps first..last as train_grpo records them: a held-out check every 10th step, the
    checkpoint (of the steps in checkpoint_at) before the step's own row is logged."""
    with run.steps("grpo", last, done=first - 1) as steps:
        for step in steps.over(range(first, last + 1)):
            ctx.publish()
            metrics = {"loss": 1.0 / step, "reward_mean": step % 7 / 7, "kl": 0.01 * step, "grad_norm": 0.5}
            if step % 10 == 0:
                run.metrics.log("val", step, {"accuracy": step % 3 / 3})
            if step in checkpoint_at:
                run.checkpoint(ctx, step, metrics, {"epoch": 0, "position": 8 * step})
            steps.record(step, metrics)
    run._checkpoints_written()


def _state_bytes(run: Run, step: int) -> int:
    return (run.run_dir / "checkpoints" / f"step_{step:06d}" / "coordinator.json").stat().st_size


def test_the_coordinator_state_of_a_checkpoint_does_not_grow_with_the_run(tmp_path):
    run, ctx = _run(tmp_path), _Ctx()
    _steps(run, ctx, 1, 2000, checkpoint_at={20, 2000})
    early, late = _state_bytes(run, 20), _state_bytes(run, 2000)
    assert len(run.metrics.history) == 2000 + 200
    # the step, the cursor and the rows' mark have a few more digits; the RNG is the same size
    assert late - early < 64, (early, late)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_resume_rebuilds_the_checkpoints_rows_from_metrics_jsonl_and_drops_later_ones(tmp_path):
    run, ctx = _run(tmp_path), _Ctx()
    run.metrics.log("sft", 5, {"loss": 2.0})  # a warm start's row: part of the history too
    _steps(run, ctx, 1, 12, checkpoint_at={6})
    logged = _lines(run.metrics.path)
    kept = logged[:1 + 6]  # the SFT row, GRPO steps 1-6 (the checkpoint's own row logged after it)
    with open(run.metrics.path, "a") as f:
        f.write('{"phase": "grpo", "st')  # a row cut by the coordinator's death
    run._log_file.close()

    again, ctx = _run(tmp_path, resume=True), _Ctx()
    state = again._restore(ctx, *again.resume_from)
    assert state.step == 6 and ctx.services.trainer.loaded
    assert _lines(again.metrics.path) == kept  # the rows as metrics.jsonl had them, the later ones dropped
    assert again.metrics.history == [json.loads(line) for line in kept]
    assert "time_step_s" in again.metrics.history[-1]  # the checkpoint step's row as it was logged
    _steps(again, ctx, 7, 8)  # the resumed run logs its steps after the checkpoint's rows
    assert [(r["phase"], r["step"]) for r in map(json.loads, _lines(again.metrics.path))][-3:] == \
        [("grpo", 6), ("grpo", 7), ("grpo", 8)]
    assert again.metrics.history == [json.loads(line) for line in _lines(again.metrics.path)]
    again._log_file.close()


def test_an_older_checkpoint_with_its_rows_resumes_and_a_missing_history_stops_a_resume_first(tmp_path):
    run, ctx = _run(tmp_path), _Ctx()
    _steps(run, ctx, 1, 4, checkpoint_at={2})
    run._log_file.close()
    saved = run.run_dir / "checkpoints" / "step_000002" / "coordinator.json"
    state = json.loads(saved.read_text())
    rows = [{**json.loads(line), "time_step_s": 9.0} for line in _lines(run.metrics.path)[:2]]
    older = {**{k: v for k, v in state.items() if k != "history"}, "metrics": rows}  # as checkpoints were written
    saved.write_text(json.dumps(older))
    again, ctx = _run(tmp_path, resume=True), _Ctx()
    assert again._restore(ctx, *again.resume_from).step == 2
    assert again.metrics.history == rows and _lines(again.metrics.path) == [json.dumps(row) for row in rows]
    again._log_file.close()

    saved.write_text(json.dumps(state))  # a checkpoint with the mark, and no metrics.jsonl
    again.metrics.path.unlink()
    with pytest.raises(ValueError, match="metrics.jsonl is missing"):  # HistoryMismatch
        _run(tmp_path, resume=True)
