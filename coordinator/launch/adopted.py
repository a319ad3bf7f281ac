"""A service process started by an earlier coordinator of the same run: not our child, so it
is watched by pid (through /proc), with its start time checked so that a pid the kernel has
since given to another process is never mistaken for it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces), or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else 0


def _running(pid: int, ticks: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == ticks


class AdoptedProcess:
    """The subset of subprocess.Popen the launcher uses: pid, poll(), wait(timeout)."""

    def __init__(self, pid: int, ticks: int):
        self.pid = pid
        self._ticks = ticks
        self.returncode: int | None = None

    @classmethod
    def find(cls, pid: int, ticks: int) -> AdoptedProcess | None:
        """The process if it still runs (same pid and start time), else None."""
        return cls(pid, ticks) if ticks and _running(pid, ticks) else None

    def poll(self) -> int | None:
        """None while it runs; -1 once it is gone (its exit code went to its real parent)."""
        if self.returncode is None and not _running(self.pid, self._ticks):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode


def descendants(pid: int) -> list[int]:
    """Every process below pid (children first found through /proc), e.g. torchrun's ranks, which
    torchrun starts in sessions of their own: a signal to torchrun's group does not reach them."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            found += children
            frontier += children
    return found
