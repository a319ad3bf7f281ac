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
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

from tandem.durable import fsync_dir, replace_durably

WRITE_POLL_S = 30.0
"""Seconds of one `checkpoint_written` call (it is repeated until the write ends or the limit)."""


class CheckpointWriteFailed(RuntimeError):
    """A background checkpoint write did not complete (the trainer failed or died meanwhile)."""


class CheckpointWriter:
    """Saves of one run's checkpoints under `root`, each completed in the background."""

    def __init__(self, root: Path, keep: int, log, *, save_hf: bool = False, write_limit_s: float = 3600.0):
        """write_limit_s: how long a write may take before the checkpoint counts as failed."""
        self.root, self.keep, self.log, self.save_hf, self.write_limit_s = root, keep, log, save_hf, write_limit_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.write_seconds = 0.0
        """Seconds from each save's start to its completion, summed over the completed saves."""

    def save(self, step: int, state: dict, trainer, critic=None) -> Path:
        """Start checkpoint `step` (waiting for the previous one first); returns the directory it
        will have once complete. Raises CheckpointWriteFailed if the previous one failed. `critic`:
        a PPO run's critic service, whose part goes into critic/ (the checkpoint is complete once
        both are on disk)."""
        self.wait()
        self.root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
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
        self._thread = threading.Thread(target=self._complete, args=(step, parts, tmp, final, started),
                                        name=f"checkpoint-{step}", daemon=True)
        self._thread.start()
        return final

    def wait(self) -> None:
        """Until the save in flight (if any) is complete; raises CheckpointWriteFailed if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointWriteFailed(f"the last checkpoint was not written: {error}") from error

    def settle(self) -> BaseException | None:
        """Until the save in flight ends, complete or failed (the trainer died: its error is returned, not raised)."""
        try:
            self.wait()
        except CheckpointWriteFailed as exc:
            return exc
        return None

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
