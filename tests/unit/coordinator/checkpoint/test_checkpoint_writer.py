"""CheckpointWriter (coordinator/checkpoint/store.py): a save returns while the trainer still
writes; the checkpoint is renamed into place, named by `latest` and logged only once the
trainer says it is on disk; a trainer that dies meanwhile leaves resume on the previous one."""

import json
import threading

import pytest

from coordinator.checkpoint import resume, store
from tandem.rpc import RpcFailure, Status


class Events:
    """A logger that keeps each event's fields."""

    def __init__(self):
        self.events: list[dict] = []

    def _add(self, event, **fields):
        self.events.append({"event": event, **fields})

    info = warning = debug = _add

    def named(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]


class SlowTrainer:
    """A trainer whose background write ends when the test says (or never: it dies)."""

    def __init__(self):
        self.saved: list[tuple[str, bool]] = []
        self.release = threading.Event()
        self.dead = False

    def save_checkpoint(self, path: str, *, background: bool = False) -> int:
        self.saved.append((path, background))
        return 1

    def checkpoint_written(self, path: str, timeout_s: float) -> bool:
        if not self.release.wait(min(timeout_s, 10.0)):
            return False
        if self.dead:
            raise RpcFailure(Status.UNAVAILABLE, "the trainer is gone")
        return True


def _state(step: int) -> dict:
    return {"step": step, "weight_version": step, "cursor": {"epoch": 0, "position": step}}


def test_a_save_returns_before_the_write_and_counts_only_once_written(tmp_path):
    log, trainer = Events(), SlowTrainer()
    writer = store.CheckpointWriter(tmp_path, keep=2, log=log)
    final = writer.save(2, _state(2), trainer)
    assert trainer.saved == [(str((tmp_path / ".tmp_step_000002" / "trainer").resolve()), True)]
    # returned while the trainer still writes: nothing to resume from yet, nothing logged
    assert not final.exists() and store.latest(tmp_path) is None and not log.named("checkpoint_saved")
    with pytest.raises(resume.NothingToResume):
        resume.find(tmp_path)
    trainer.release.set()
    writer.wait()
    assert store.latest(tmp_path) == final and json.loads((final / "coordinator.json").read_text())["step"] == 2
    assert [e["step"] for e in log.named("checkpoint_saved")] == [2]


def test_a_trainer_that_dies_mid_write_leaves_resume_on_the_previous_checkpoint(tmp_path):
    log, trainer = Events(), SlowTrainer()
    writer = store.CheckpointWriter(tmp_path, keep=2, log=log)
    trainer.release.set()
    writer.save(2, _state(2), trainer)
    writer.wait()
    trainer.release.clear()
    writer.save(4, _state(4), trainer)
    trainer.dead = True
    trainer.release.set()
    lost = writer.settle()
    assert isinstance(lost, store.CheckpointWriteFailed) and "the trainer is gone" in str(lost)
    path, state = resume.find(tmp_path)
    assert path.name == "step_000002" and state.step == 2
    assert (tmp_path / ".tmp_step_000004" / "coordinator.json").is_file()  # left, never resumed from
    assert [e["step"] for e in log.named("checkpoint_failed")] == [4]
    writer.wait()  # the failure was reported once


def test_the_next_save_waits_for_the_previous_write_and_reports_its_failure(tmp_path):
    trainer = SlowTrainer()
    writer = store.CheckpointWriter(tmp_path, keep=1, log=Events())
    writer.save(1, _state(1), trainer)
    second = threading.Thread(target=writer.save, args=(2, _state(2), trainer))
    second.start()
    second.join(0.3)
    assert second.is_alive() and len(trainer.saved) == 1  # blocked behind the first write
    trainer.release.set()
    second.join(30)
    writer.wait()
    assert len(trainer.saved) == 2 and store.latest(tmp_path).name == "step_000002"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000002"]  # keep=1

    trainer.release.clear()
    writer.save(3, _state(3), trainer)
    trainer.dead = True
    trainer.release.set()
    with pytest.raises(store.CheckpointWriteFailed):
        writer.save(4, _state(4), trainer)


def test_a_ppo_checkpoint_is_complete_only_once_the_critic_has_written_too(tmp_path):
    log, trainer, critic = Events(), SlowTrainer(), SlowTrainer()
    writer = store.CheckpointWriter(tmp_path, keep=2, log=log)
    trainer.release.set()  # the policy's part is on disk at once, the critic's is not
    final = writer.save(2, _state(2), trainer, critic)
    assert critic.saved == [(str((tmp_path / ".tmp_step_000002" / "critic").resolve()), True)]
    writer._thread.join(timeout=0.5)
    assert store.latest(tmp_path) is None and not log.named("checkpoint_saved")
    critic.release.set()
    writer.wait()
    assert store.latest(tmp_path) == final and [e["step"] for e in log.named("checkpoint_saved")] == [2]


class FullDiskTrainer(SlowTrainer):
    """A trainer on a disk that is full while `full` is set: the save answers with the disk's
    error (DCP's metadata), or the background write fails (the tensors' bytes)."""

    def __init__(self, *, in_background: bool = False):
        super().__init__()
        self.release.set()
        self.full, self.in_background = False, in_background

    def save_checkpoint(self, path: str, *, background: bool = False) -> int:
        if self.full and not self.in_background:
            raise RpcFailure(Status.INTERNAL, "the checkpoint save failed: rank 0: OSError: [Errno 28] No space left")
        return super().save_checkpoint(path, background=background)

    def checkpoint_written(self, path: str, timeout_s: float) -> bool:
        if self.full and self.in_background:
            raise RpcFailure(Status.INTERNAL, "the checkpoint write failed: [Errno 28] No space left on device")
        return super().checkpoint_written(path, timeout_s)


@pytest.mark.parametrize("in_background", [False, True])
def test_a_full_disk_fails_checkpoints_without_stopping_the_run_up_to_the_limit(tmp_path, in_background):
    """A full disk used to stop the run at its first failed checkpoint (the trainer's error, or
    CheckpointWriteFailed at the next save); now up to max_failures saves in a row may fail, each
    logged and its directory removed, `latest` staying on the last complete one."""
    log, trainer = Events(), FullDiskTrainer(in_background=in_background)
    writer = store.CheckpointWriter(tmp_path, keep=2, log=log, max_failures=2)
    writer.save(1, _state(1), trainer)
    writer.wait()
    trainer.full = True
    for step in (2, 3):
        writer.save(step, _state(step), trainer)  # no error: the run goes on
    writer.wait()
    assert writer.failed_in_a_row == 2 and [e["step"] for e in log.named("checkpoint_failed")] == [2, 3]
    assert store.latest(tmp_path).name == "step_000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]  # the partial ones removed
    trainer.full = False
    writer.save(4, _state(4), trainer)
    writer.wait()
    assert writer.failed_in_a_row == 0 and store.latest(tmp_path).name == "step_000004"  # a success resets the count
    trainer.full = True
    for step in (5, 6):
        writer.save(step, _state(step), trainer)
    with pytest.raises((RpcFailure, store.CheckpointWriteFailed), match="No space left"):
        writer.save(7, _state(7), trainer)  # the third in a row
        writer.wait()
    assert store.latest(tmp_path).name == "step_000004"


def test_an_unreachable_trainer_is_not_a_failed_save(tmp_path):
    """Its error goes to the run, which relaunches the trainer, however many failures are allowed."""
    class Gone(SlowTrainer):
        def save_checkpoint(self, path, *, background=False):
            raise RpcFailure(Status.UNAVAILABLE, "connection refused")

    writer = store.CheckpointWriter(tmp_path, keep=2, log=Events(), max_failures=5)
    with pytest.raises(RpcFailure, match="connection refused"):
        writer.save(1, _state(1), Gone())
    assert writer.failed_in_a_row == 0
