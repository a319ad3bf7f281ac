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
