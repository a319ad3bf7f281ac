"""Whether a local process is there, and how much CPU it has used: what tells a busy member
(its heartbeats starved by its own work) from a dead, stopped or hung one.

Read from /proc, so only for processes in this host's process namespace: the services a local
run launched itself (coordinator/launch/local.py), never members that joined from elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_GONE_STATES = frozenset("TtZX")  # stopped (SIGSTOP), traced, zombie, dead


@dataclass(frozen=True)
class Vitals:
    state: str
    """/proc's state letter: R running, S/D waiting, T stopped, Z zombie, ..."""
    cpu_s: float
    """User + system CPU time of the whole process (every thread)."""

    @property
    def can_work(self) -> bool:
        """Not stopped, traced or exited: it may be working."""
        return self.state not in _GONE_STATES


def process_vitals(pid: int) -> Vitals | None:
    """The process's state and CPU time; None if there is no such process here."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return Vitals(fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))


def context_switches(pid: int) -> int | None:
    """How many times the process's main thread has been switched out (voluntary and not); None if
    there is no such process here. A stopped process's count stands still, and any spell of
    running moves it (even an idle one: SIGCONT wakes it, and it goes back to sleep), so an
    unchanged count between two looks that both found it stopped means it never ran in between."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return sum(int(line.split()[1]) for line in lines
               if line.split(":")[0] in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
