"""Recovery decisions and adopting the processes of an earlier coordinator, without services."""

import json
import subprocess
import sys
import time

import pytest
import structlog

from coordinator.checkpoint.resume import find_unfinished, resume_version
from coordinator.config import load_config
from coordinator.launch.adopted import AdoptedProcess, descendants, start_ticks
from coordinator.launch.launcher import LocalLauncher, ServiceSpec
from coordinator.launch.supervisor import dead_trainers, trainer_dead
from tandem.kinds import ServiceKind
from tandem.rpc import RpcFailure, Status

LOG = structlog.get_logger()


def test_resume_version_keeps_the_checkpoint_version_unless_something_newer_is_served():
    assert resume_version(4, [0, 0]) == 4  # fresh generators: the uninterrupted run's versions
    assert resume_version(4, [4, 3]) == 4
    assert resume_version(4, [7, 6]) == 8  # generators that outlived the trainer refuse older versions
    assert resume_version(4, []) == 4


class _Launcher:
    def __init__(self, exited, exits_within=None):
        self._exited = exited
        self._exits_within = exits_within  # seconds until the process exits (None: it keeps running)

    def exited(self, name):
        return self._exited

    def wait_exit(self, name, timeout_s):
        return 1 if self._exits_within is not None and self._exits_within <= timeout_s else None


class _Services:
    def __init__(self, error=None):
        self._error = error

    def trainer_of(self, kind):
        if isinstance(self._error, RuntimeError):
            raise self._error
        self.asked = kind
        return self

    def info(self):
        if self._error is not None:
            raise self._error


def _Unavailable() -> RpcFailure:
    return RpcFailure(Status.UNAVAILABLE, "gone")


def test_a_dead_critic_is_told_apart_from_the_trainer():
    class Launcher(_Launcher):
        def exited(self, name):
            return name == "critic"

    assert trainer_dead(_Services(), Launcher(exited=None), kind=ServiceKind.CRITIC)
    assert not trainer_dead(services := _Services(), Launcher(exited=None))
    assert services.asked is ServiceKind.TRAINER


def test_dead_trainers_waits_for_either_after_a_failed_call():
    class Launcher:
        def __init__(self, exits):
            self.exits, self.asked = exits, 0  # the name that exits after a few polls

        def exited(self, name):
            self.asked += 1
            return name == self.exits and self.asked > 6

        def wait_exit(self, name, timeout_s):
            raise AssertionError("one at a time would wait out the trainer's grace before the critic's")

    kinds = [ServiceKind.TRAINER, ServiceKind.CRITIC]
    broken = RpcFailure(Status.INTERNAL, "Connection reset by peer")
    assert dead_trainers(_Services(), Launcher("critic"), kinds, broken, grace_s=5, poll_s=0.01) == [ServiceKind.CRITIC]
    assert dead_trainers(_Services(), Launcher("nobody"), kinds, broken, grace_s=0.05, poll_s=0.01) == []
    refused = RpcFailure(Status.INVALID_ARGUMENT, "bad batch")
    assert dead_trainers(_Services(), Launcher("critic"), kinds, refused, grace_s=5, poll_s=0.01) == []


def test_trainer_dead():
    assert trainer_dead(_Services(), _Launcher(exited=True))
    assert trainer_dead(_Services(_Unavailable()), _Launcher(exited=False))
    assert trainer_dead(_Services(RuntimeError("no live trainer")), _Launcher(exited=False))
    assert not trainer_dead(_Services(), _Launcher(exited=False))


def test_a_failed_call_while_rank_0_still_answers_waits_for_torchrun_to_tear_the_trainer_down():
    broken = RpcFailure(Status.INTERNAL, "RuntimeError: [gloo] Connection reset by peer")  # rank 1 died
    assert trainer_dead(_Services(), _Launcher(exited=False, exits_within=3.0), broken)
    assert not trainer_dead(_Services(), _Launcher(exited=False), broken, grace_s=0.1)  # it kept running
    refused = RpcFailure(Status.INVALID_ARGUMENT, "bad batch")  # the request's fault: no waiting
    assert not trainer_dead(_Services(), _Launcher(exited=False, exits_within=3.0), refused)


def test_find_unfinished(tmp_path):
    cfg = load_config(overrides=[f"logger.log_dir={tmp_path}", "logger.run_name=r"])
    assert find_unfinished(load_config(overrides=[f"logger.log_dir={tmp_path}"])) is None  # no name: fresh
    assert find_unfinished(cfg) is None  # nothing saved
    step = tmp_path / "r" / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "coordinator.json").write_text(json.dumps({"step": 2, "weight_version": 3, "cursor": {}}))
    (tmp_path / "r" / "checkpoints" / "latest").write_text("step_000002")
    path, state = find_unfinished(cfg)
    assert path == step and state.step == 2 and state.weight_version == 3
    (tmp_path / "r" / "summary.json").write_text("{}")
    assert find_unfinished(cfg) is None  # it finished: a new run of that name starts fresh


def test_a_restarted_launcher_adopts_live_services_and_stops_them(tmp_path):
    state = tmp_path / "services.json"
    first = LocalLauncher(tmp_path / "logs", {}, LOG, state_file=state)
    sleeper = ServiceSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"])
    first.start(sleeper)
    first.start(ServiceSpec("quick", [sys.executable, "-c", "pass"]))
    pid = first.pids()["sleeper"]
    first._children[1].process.wait(timeout=30)
    # a new coordinator of the same run: the live one is adopted, the finished one is not
    second = LocalLauncher(tmp_path / "logs", {}, LOG, state_file=state)
    assert second.adopt() == ["sleeper"] and second.pids() == {"sleeper": pid}
    second.start(sleeper)  # kept, not started twice
    assert second.pids() == {"sleeper": pid} and not second.exited("sleeper")
    second.check()
    second.stop_all(grace_s=5)
    assert AdoptedProcess.find(pid, start_ticks(pid) or 1) is None
    first._children[0].process.wait(timeout=10)  # reap it (the first launcher is its real parent)


def test_an_adopted_pid_must_have_the_recorded_start_time():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = start_ticks(process.pid)
        assert AdoptedProcess.find(process.pid, ticks) is not None
        assert AdoptedProcess.find(process.pid, ticks + 1) is None  # a reused pid is not ours
        adopted = AdoptedProcess(process.pid, ticks)
        with pytest.raises(subprocess.TimeoutExpired):
            adopted.wait(timeout=0.1)
        process.kill()
        process.wait()
        assert adopted.poll() == -1
    finally:
        process.kill()


def test_restart_kills_descendants_in_sessions_of_their_own(tmp_path):
    """torchrun starts its ranks with start_new_session: a restart must not leave them running."""
    launcher = LocalLauncher(tmp_path / "logs", {}, LOG, state_file=tmp_path / "services.json")
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "start_new_session=True); time.sleep(120)")
    launcher.start(ServiceSpec("tree", [sys.executable, "-c", code]))
    leader = launcher.pids()["tree"]
    deadline = time.monotonic() + 30
    while not descendants(leader):
        assert time.monotonic() < deadline, "the grandchild never started"
        time.sleep(0.05)
    grandchild = descendants(leader)[0]
    ticks = start_ticks(grandchild)
    launcher.restart("tree")
    deadline = time.monotonic() + 10
    while AdoptedProcess.find(grandchild, ticks) is not None:
        assert time.monotonic() < deadline, "the grandchild in its own session survived the restart"
        time.sleep(0.05)
    assert launcher.pids()["tree"] != leader
    launcher.stop_all(grace_s=2)


def test_resume_of_a_run_that_finished_its_steps_is_refused_but_more_steps_extend_it(tmp_path):
    from coordinator.checkpoint.resume import NothingToResume, RunFinished, find_for

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"grpo_steps": 4}))
    done = load_config(overrides=[f"logger.log_dir={tmp_path}", "logger.run_name=r", "grpo.max_num_steps=4"])
    with pytest.raises(RunFinished, match="finished its 4 GRPO steps"):
        find_for(done)
    more = load_config(overrides=[f"logger.log_dir={tmp_path}", "logger.run_name=r", "grpo.max_num_steps=6"])
    with pytest.raises(NothingToResume, match="no complete checkpoint") as caught:  # it would extend a checkpoint
        find_for(more)
    assert not isinstance(caught.value, RunFinished)
