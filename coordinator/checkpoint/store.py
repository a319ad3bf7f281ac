"""Loop checkpoints: <dir>/step_NNNNNN/{trainer/, coordinator.json[, critic/, hf/]} (critic/: a PPO
run's critic service, saved with the policy so the two resume together), written into a
temporary directory and renamed, so a checkpoint exists only once both parts are complete;
`latest` names the newest complete one; only the last K are kept.

The trainer writes its part in the background (`CheckpointWriter`): a save returns once the
trainer has taken its state, and the run goes on while the bytes go to disk. Only when the
trainer says they are on disk on every rank (`checkpoint_written`) is the directory renamed
into place, `latest` moved and `checkpoint_saved` logged; a crash before then (the trainer's or
the coordinator's) leaves a `.tmp_step_*` directory that nothing resumes from. The next save
waits for the previous write.

A save that fails (a full disk, a write error: the trainer answers with the error, or the
coordinator's own file cannot be written) is logged as `checkpoint_failed`, its directory is
removed, and the run goes on from the last complete checkpoint: up to `max_failures` saves in a
row may fail (checkpointing.max_failed_saves), and the next one stops the run with
CheckpointWriteFailed. A trainer that cannot be reached is not a failed save: its error goes to
the run, which relaunches the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

from tandem.durable import fsync_dir, replace_durably
from tandem.rpc import RpcFailure

WRITE_POLL_S = 30.0
"""Seconds of one `checkpoint_written` call (it is repeated until the write ends or the limit)."""


class CheckpointWriteFailed(RuntimeError):
    """A background checkpoint write did not complete (the trainer failed or died meanwhile)."""


class CheckpointWriter:
    """Saves of one run's checkpoints under `root`, each completed in the background."""

    def __init__(self, root: Path, keep: int, log, *, save_hf: bool = False, write_limit_s: float = 3600.0,
                 max_failures: int = 0):
        """write_limit_s: how long a write may take before the checkpoint counts as failed.
        max_failures: saves that may fail in a row before one raises CheckpointWriteFailed."""
        self.root, self.keep, self.log, self.save_hf, self.write_limit_s = root, keep, log, save_hf, write_limit_s
        self.max_failures = max_failures
        self.failed_in_a_row = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._writing: Path | None = None  # the directory of the save in flight
        self.write_seconds = 0.0
        """Seconds from each save's start to its completion, summed over the completed saves."""

    def save(self, step: int, state: dict, trainer, critic=None) -> Path | None:
        """Start checkpoint `step` (waiting for the previous one first); returns the directory it
        will have once complete, None if it could not start (a failed save, logged). Raises
        CheckpointWriteFailed when this makes more than max_failures failed saves in a row (a
        service's or a file's error as it came, for a save that could not start). `critic`: a PPO
        run's critic service, whose part goes into critic/ (the checkpoint is complete once both
        are on disk)."""
        self.wait()
        self.root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            trainer_dir = str((tmp / "trainer").resolve())
            trainer.save_checkpoint(trainer_dir, background=True)
            parts = [(trainer, trainer_dir)]
            if critic is not None:
                critic_dir = str((tmp / "critic").resolve())
                critic.save_checkpoint(critic_dir, background=True)
                parts.append((critic, critic_dir))
            if self.save_hf:
                trainer.export_hf(str((tmp / "hf").resolve()))  # complete when the step directory is renamed into place
            replace_durably(tmp / "coordinator.json", json.dumps(state, indent=1))
        except (RpcFailure, OSError) as exc:
            if isinstance(exc, RpcFailure) and exc.status.unreachable:
                raise  # no service to answer: the run relaunches it
            self.log.warning("checkpoint_failed", step=step, error=f"{type(exc).__name__}: {exc}"[:500])
            shutil.rmtree(tmp, ignore_errors=True)
            if self._count_failure():
                raise
            return None
        self._writing = tmp
        self._thread = threading.Thread(target=self._complete, args=(step, parts, tmp, final, started),
                                        name=f"checkpoint-{step}", daemon=True)
        self._thread.start()
        return final

    def wait(self) -> None:
        """Until the save in flight (if any) ends. A failed one (logged when it failed) counts,
        and its directory is removed: CheckpointWriteFailed once more than max_failures saves
        in a row failed."""
        error = self.settle()
        if error is None:
            return
        if self._writing is not None:
            shutil.rmtree(self._writing, ignore_errors=True)  # the room it took, for the next save
        if self._count_failure():
            limit = (f" ({self.failed_in_a_row} in a row; checkpointing.max_failed_saves={self.max_failures})"
                     if self.max_failures else "")
            raise CheckpointWriteFailed(f"the last checkpoint was not written{limit}: {error.__cause__}") \
                from error.__cause__

    def settle(self) -> BaseException | None:
        """Until the save in flight ends, complete or failed (the trainer died: its error is
        returned as a CheckpointWriteFailed, not raised, and not counted)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is None:
            return None
        error, self._error = self._error, None
        failed = CheckpointWriteFailed(f"the last checkpoint was not written: {error}")
        failed.__cause__ = error
        return failed

    def _count_failure(self) -> bool:
        """Count a failed save; whether that makes too many in a row."""
        self.failed_in_a_row += 1
        return self.failed_in_a_row > self.max_failures

    def _complete(self, step: int, parts: list, tmp: Path, final: Path, started: float) -> None:
        try:
            deadline = time.monotonic() + self.write_limit_s
            for service, directory in parts:  # the trainer's part, then the critic's (written meanwhile)
                while not service.checkpoint_written(directory, timeout_s=WRITE_POLL_S):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the checkpoint write into {Path(directory).name}/ took over "
                                           f"{self.write_limit_s:.0f}s")

            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            fsync_dir(self.root)
            replace_durably(self.root / "latest", final.name)
            for old in sorted(p for p in self.root.glob("step_*") if p.is_dir())[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            for stale in self.root.glob(".tmp_step_*"):  # left by a crash mid-write
                if stale.name < tmp.name:
                    shutil.rmtree(stale, ignore_errors=True)
            seconds = time.perf_counter() - started
            self.write_seconds += seconds
            self.failed_in_a_row = 0
            self.log.info("checkpoint_saved", path=str(final), step=step, seconds=round(seconds, 3))
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            self._error = exc
            self.log.warning("checkpoint_failed", step=step, error=f"{type(exc).__name__}: {exc}"[:500])


def latest(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "coordinator.json").is_file() else None
