"""The supervisor's decisions on fake processes and membership: relaunch with backoff, bounded,
counted in the run status; notices while a needed service is missing, repeated, and when back;
a service with a process stopped (SIGSTOP) too long is killed, on real processes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from coordinator.launch.supervisor import Need, Supervisor
from coordinator.membership.registry import Member
from coordinator.membership.status import RunStatus
from tandem.kinds import ServiceKind


class FakeLauncher:
    def __init__(self):
        self.dead: dict[str, int] = {}
        self.restarts: dict[str, int] = {}
        self.relaunched: list[str] = []
        self.processes: dict[str, int] = {}
        self.killed: list[str] = []

    def exited_nonessential(self) -> dict[str, int]:
        return dict(self.dead)

    def restart(self, name: str) -> None:
        self.dead.pop(name, None)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.relaunched.append(name)

    def pids(self) -> dict[str, int]:
        return dict(self.processes)

    def kill(self, name: str) -> None:
        self.killed.append(name)


class FakeRegistry:
    def __init__(self, *members: Member):
        self.members = list(members)

    def live(self) -> list[Member]:
        return list(self.members)


TRAINER = Member("t", ServiceKind.TRAINER, "a:1")
GENERATOR = Member("g", ServiceKind.GENERATOR, "a:2")
REWARD = Member("r", ServiceKind.REWARD, "a:3", tasks=("arithmetic",))
NEEDS = {"the trainer": Need(ServiceKind.TRAINER), "a generator": Need(ServiceKind.GENERATOR),
         "the reward service of task 'arithmetic'": Need(ServiceKind.REWARD, "arithmetic")}


def _supervisor(launcher, registry, notices, **kwargs) -> tuple[Supervisor, RunStatus]:
    status = RunStatus("r")
    return Supervisor(launcher, registry, status, structlog.get_logger(), needs=lambda: NEEDS,
                      notify=notices.append, **kwargs), status


def test_a_dead_generator_is_relaunched_after_a_doubling_backoff_and_at_most_max_restarts_times():
    launcher, registry, notices = FakeLauncher(), FakeRegistry(TRAINER, REWARD), []
    supervisor, status = _supervisor(launcher, registry, notices, max_restarts=2, backoff_s=1.0, grace_s=0.0)
    launcher.dead["generator-0"] = -9
    supervisor.tick(100.0)
    assert launcher.relaunched == []
    assert "generator-0 exited (code -9); relaunching it in 1s (relaunch 1 of 2)" in notices
    supervisor.tick(101.0)
    assert launcher.relaunched == ["generator-0"] and status.snapshot()["service_restarts"] == {"generator-0": 1}
    launcher.dead["generator-0"] = 1  # it died again: twice the wait
    supervisor.tick(102.0)
    supervisor.tick(103.5)
    assert launcher.relaunched == ["generator-0"]
    supervisor.tick(104.0)
    assert launcher.relaunched == ["generator-0", "generator-0"]
    launcher.dead["generator-0"] = 1  # a third death: given up
    for now in (105.0, 200.0, 300.0):
        supervisor.tick(now)
    assert launcher.relaunched == ["generator-0", "generator-0"]
    assert any("not relaunching it again" in n for n in notices)


def test_while_a_needed_service_is_missing_the_notice_repeats_and_says_what_is_done():
    launcher, registry, notices = FakeLauncher(), FakeRegistry(TRAINER, GENERATOR), []
    supervisor, _ = _supervisor(launcher, registry, notices, backoff_s=2.0, notice_period_s=5.0, grace_s=1.0)
    launcher.dead["reward-arithmetic"] = -9
    supervisor.tick(0.0)  # noticed the death; not yet missing for the grace period
    supervisor.tick(1.0)
    waiting = [n for n in notices if n.startswith("waiting for the reward service of task 'arithmetic'")]
    assert len(waiting) == 1 and "reward-arithmetic relaunches in 1s" in waiting[0]
    supervisor.tick(2.0)  # relaunched
    for now in (3.0, 4.0, 6.0, 7.0, 11.0):
        supervisor.tick(now)
    waiting = [n for n in notices if n.startswith("waiting for the reward service")]
    assert len(waiting) == 3 and "relaunched 4s ago, starting" in waiting[1] and "(11s)" in waiting[2]
    registry.members.append(REWARD)
    supervisor.tick(12.0)
    assert notices[-1] == "the reward service of task 'arithmetic': back after 12s"
    supervisor.tick(30.0)
    assert notices[-1].endswith("back after 12s")  # nothing more once it is back


def test_without_relaunching_it_only_says_what_it_waits_for():
    launcher, registry, notices = FakeLauncher(), FakeRegistry(), []
    supervisor, _ = _supervisor(launcher, registry, notices, relaunch=False, grace_s=0.0)
    launcher.dead["generator-0"] = -9
    supervisor.tick(0.0)
    assert launcher.relaunched == []
    assert {n.split(" (")[0] for n in notices} == {"waiting for the trainer", "waiting for a generator",
                                                   "waiting for the reward service of task 'arithmetic'"}
    assert all("none has registered" in n for n in notices)


def test_a_service_that_stopped_cleanly_is_not_relaunched():
    launcher, registry, notices = FakeLauncher(), FakeRegistry(TRAINER, GENERATOR, REWARD), []
    supervisor, _ = _supervisor(launcher, registry, notices)
    launcher.dead["generator-1"] = 0  # drained after SIGTERM (scaling down)
    for now in (0.0, 5.0, 60.0):
        supervisor.tick(now)
    assert launcher.relaunched == [] and notices == ["generator-1 stopped cleanly (exit code 0): not relaunching it"]


def test_a_service_with_a_process_stopped_past_stopped_kill_s_is_killed_a_shorter_stop_is_a_pause():
    """A service's child (as vLLM's engine below a generator, torchrun's ranks below the agent)
    stopped with SIGSTOP: killed once stopped for stopped_kill_s, not before, and a SIGCONT in
    between starts the count again. Without this a stopped service was waited for forever."""
    script = "import subprocess, time; c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", script],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        launcher, notices = FakeLauncher(), []
        launcher.processes = {"generator-0": parent.pid}
        supervisor, _ = _supervisor(launcher, FakeRegistry(TRAINER, GENERATOR, REWARD), notices, stopped_kill_s=30.0,
                                    stopped_check_s=0.0)
        supervisor.tick(100.0)
        os.kill(child, signal.SIGSTOP)
        _wait_state(child, "T")
        supervisor.tick(101.0)
        supervisor.tick(130.0)  # stopped for 29 s: a pause so far
        assert launcher.killed == []
        os.kill(child, signal.SIGCONT)
        _wait_state(child, "S")
        supervisor.tick(132.0)  # running again: the count starts over
        os.kill(child, signal.SIGSTOP)
        _wait_state(child, "T")
        supervisor.tick(140.0)
        supervisor.tick(169.0)
        assert launcher.killed == []
        supervisor.tick(170.0)
        assert launcher.killed == ["generator-0"]
        assert any(f"generator-0 has been stopped (pids [{child}], state T) for 30s" in n for n in notices), notices
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        os.kill(child, signal.SIGKILL)
        parent.wait()


def _wait_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != state:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {state}"
        time.sleep(0.01)


def test_a_slow_service_stopped_at_every_look_but_running_in_between_is_not_killed():
    """A slow service (benchmarks/chaos.py's slow_generator: stopped and continued over and over,
    so it runs a fraction of the time) may be seen stopped at every look of the supervisor, yet
    it ran in between: it is making progress and must not be killed as a hung one. Found by the
    nemesis's slow generator: the supervisor, looking once a second at a process stopped 3/4 of
    the time, saw it stopped at every look for stopped_kill_s now and then and killed it. A
    process truly stopped since the first look is still killed (the test above)."""
    script = "import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        launcher, notices = FakeLauncher(), []
        launcher.processes = {"generator-0": proc.pid}
        supervisor, _ = _supervisor(launcher, FakeRegistry(TRAINER, GENERATOR, REWARD), notices, stopped_kill_s=30.0,
                                    stopped_check_s=0.0)
        for look in range(6):  # one look every 10 s, each while it is stopped; it ran between two looks
            os.kill(proc.pid, signal.SIGSTOP)
            _wait_state(proc.pid, "T")
            supervisor.tick(100.0 + 10 * look)
            os.kill(proc.pid, signal.SIGCONT)
            _wait_state(proc.pid, "S")
        assert launcher.killed == [], notices
    finally:
        proc.kill()
        proc.wait()
