"""Local mode: start every service as a child process, watch them, stop them all.

Each child runs in its own session (process group) with its log in <run>/logs/<name>.log,
so stopping is SIGTERM to each leader (which stops its own children: a generator drains
first; a SIGTERM to its whole group would also stop vLLM's engine processes at once), then
SIGKILL to the groups we created after a grace period. Ctrl-C and the end of a run both go through `stop_all`; nothing is left running.

Thread-safe: the supervisor (coordinator/launch/supervisor.py) relaunches dead services from
its own thread while the run loop checks and restarts from the main one. A service that dies
is reported with the line of its log that names the cause (coordinator/launch/log_cause.py).

Because children have their own sessions, they outlive a coordinator that is killed. Every
start is recorded in a state file (name, pid, the process's start time); a coordinator
restarted on the same run `adopt`s the services still alive there (the pid and start time
must match, so a reused pid is not mistaken for ours): `start` then skips them, `check`
watches them by pid, and `stop_all` stops them like its own children.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.launch.adopted import AdoptedProcess, descendants, start_ticks
from coordinator.launch.log_cause import cause_line
from tandem import torchrun


class ServiceDied(RuntimeError):
    """A launched service exited while the run needed it."""


@dataclass
class ServiceSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    essential: bool = True
    """False for a service the run can lose (a reward service: swapped or restarted while the
    run goes on, its calls retried): its exit is logged, not raised by check()."""


@dataclass
class _Child:
    spec: ServiceSpec
    process: subprocess.Popen | AdoptedProcess
    log_path: Path
    exit_logged: bool = False


class LocalLauncher:
    def __init__(self, log_dir: Path, base_env: dict[str, str], log, state_file: Path | None = None):
        self._log_dir = log_dir
        self._base_env = base_env
        self._log = log
        self._state_file = state_file
        self._children: list[_Child] = []
        self._lock = threading.RLock()
        self.tolerate_nonessential_exits = False
        """Set once every service has started: until then any exit is fatal (a bad setting)."""
        self.restarts: dict[str, int] = {}
        """Relaunches so far, by service name."""

    def start(self, spec: ServiceSpec) -> None:
        """Start the service, unless one of that name was adopted and is still alive."""
        with self._lock:
            self._start(spec)

    def _start(self, spec: ServiceSpec) -> None:
        if any(c.spec.name == spec.name and c.process.poll() is None for c in self._children):
            self._log.info("service_kept", name=spec.name, pid=self.pids()[spec.name])
            return
        self._children = [c for c in self._children if c.spec.name != spec.name]
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / f"{spec.name}.log"
        env = {**os.environ, **self._base_env, **spec.env}
        with open(log_path, "ab") as out:
            process = subprocess.Popen(spec.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self._children.append(_Child(spec, process, log_path))
        self._log.info("service_started", name=spec.name, pid=process.pid, log=str(log_path))
        self._save_state()

    def restart(self, name: str) -> None:
        """Kill what is left of the named service's process group and start it again."""
        with self._lock:
            child = next(c for c in self._children if c.spec.name == name)
            kill_tree(child.process.pid)
            _wait(child.process, 10)
            self._children.remove(child)
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self._log.warning("service_restarting", name=name, old_pid=child.process.pid, code=child.process.poll(),
                              restarts=self.restarts[name])
            self._start(child.spec)

    def kill(self, name: str) -> None:
        """SIGKILL the named service's whole tree (it then counts as exited, with code -9)."""
        with self._lock:
            child = next((c for c in self._children if c.spec.name == name), None)
            if child is not None:
                kill_tree(child.process.pid)
                self._log.warning("service_killed", name=name, pid=child.process.pid)

    def exited_nonessential(self) -> dict[str, int]:
        """Name -> exit code of each service the run can lose (generators, rewards) that has exited."""
        with self._lock:
            return {c.spec.name: code for c in self._children
                    if not c.spec.essential and (code := c.process.poll()) is not None}

    def wait_exit(self, name: str, timeout_s: float) -> int | None:
        """The named service's exit code once it has exited (None if it still runs after timeout_s)."""
        with self._lock:
            child = next(c for c in self._children if c.spec.name == name)
        _wait(child.process, timeout_s)
        return child.process.poll()

    def exited(self, name: str) -> bool:
        with self._lock:
            return any(c.spec.name == name and c.process.poll() is not None for c in self._children)

    def adopt(self) -> list[str]:
        """Take over the services an earlier coordinator of this run started and that still run."""
        if self._state_file is None or not self._state_file.is_file():
            return []
        adopted = []
        for name, entry in json.loads(self._state_file.read_text()).items():
            process = AdoptedProcess.find(entry["pid"], entry["start_ticks"])
            if process is None:
                continue
            spec = ServiceSpec(name, entry["argv"], essential=entry["essential"])
            self._children.append(_Child(spec, process, self._log_dir / f"{name}.log"))
            adopted.append(name)
        self._log.info("services_adopted", names=adopted, pids={n: p for n, p in self.pids().items() if n in adopted})
        return adopted

    def _save_state(self) -> None:
        if self._state_file is None:
            return
        state = {c.spec.name: {"pid": c.process.pid, "start_ticks": start_ticks(c.process.pid),
                               "argv": c.spec.argv, "essential": c.spec.essential} for c in self._children}
        tmp = self._state_file.with_name(self._state_file.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self._state_file)

    def check(self) -> None:
        """Raise ServiceDied (with the line of its log that names the cause) if an essential child
        has exited, or any child before every service has started."""
        with self._lock:
            self._check()

    def _check(self) -> None:
        for child in self._children:
            code = child.process.poll()
            if code is not None and not child.spec.essential and self.tolerate_nonessential_exits:
                if not child.exit_logged:
                    self._log.warning("service_exited", name=child.spec.name, pid=child.process.pid, code=code)
                    child.exit_logged = True
            elif code is not None:
                raise ServiceDied(died_message(child.spec.name, child.process.pid, code, child.log_path))

    def pids(self) -> dict[str, int]:
        with self._lock:
            return {c.spec.name: c.process.pid for c in self._children}

    def stop_all(self, grace_s: float = 15.0) -> None:
        with self._lock:
            self._stop_all(grace_s)

    def _stop_all(self, grace_s: float) -> None:
        alive = [c for c in self._children if c.process.poll() is None]
        for child in alive:  # the leader only, as a container stop does: it stops its own children
            # (torchrun its ranks; a generator drains, then shuts vLLM's engine processes down)
            _signal(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in alive:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._log.warning("service_kill", name=child.spec.name, pid=child.process.pid)
        for child in self._children:  # the whole tree: torchrun's ranks, vLLM's engine processes
            kill_tree(child.process.pid)
            _wait(child.process, 5)
        if alive:
            self._log.info("services_stopped", names=[c.spec.name for c in alive])
        self._children.clear()


def _wait(process: subprocess.Popen | AdoptedProcess, timeout_s: float) -> None:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass


def kill_tree(pid: int) -> None:
    """SIGKILL the process, its group, and every descendant with its group (torchrun starts its
    ranks in sessions of their own)."""
    for member in [*descendants(pid), pid]:
        _signal_group(member, signal.SIGKILL)
        _signal(member, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def died_message(name: str, pid: int, code: int, log_path: Path) -> str:
    """What the run says of a service that died: the cause line of its log, and where the log is."""
    try:
        cause = cause_line(log_path.read_text(errors="replace"))
    except OSError:
        cause = None
    return (f"service {name} (pid {pid}) exited with code {code}: {cause or '(its log says nothing)'}\n"
            f"(its whole log: {log_path})")


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def torchrun_module(module: str, nproc: int, *args: str) -> list[str]:
    """torchrun on this host with no listener of its own (tandem/torchrun.py)."""
    return torchrun.torchrun_module(module, nproc, *args)
