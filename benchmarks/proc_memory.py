"""Peak memory of process trees, as PSS (proportional set size: each shared page split among the
processes that map it, so summing over processes counts every page once), sampled from
/proc/<pid>/smaps_rollup.

`TreeSampler` samples, every `interval_s` in a thread, every process below a root (the benchmark
process, left out itself) and splits them into named groups: the tree of each service pid that
`service_pids()` names (a Tandem run's services, from its coordinator.log's `service_started`
events: `ServiceLog`), and "rest" for the others (the `tandem run` process itself; all of TRL's
processes). It keeps each group's peak and the peak of the whole tree (the largest sum of one
sample, not the sum of the groups' peaks). Linux only; no third-party imports.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

PROC = Path("/proc")
REST = "rest"
"""The group of the processes below the root that no service's tree holds."""


def read_ppids(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process /proc lists now (processes that vanish meanwhile are skipped)."""
    parents = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return parents


def descendants(root: int, ppids: dict[int, int]) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, parent in ppids.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def pss_kib(pid: int, proc: Path = PROC) -> int:
    """The process's PSS in KiB (0 if it has gone or cannot be read)."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def tree_pss_kib(root: int, proc: Path = PROC) -> int:
    """PSS of `root` and all its descendants, summed."""
    return sum(pss_kib(pid, proc) for pid in descendants(root, read_ppids(proc)))


def group_pss_kib(root: int, services: dict[str, int], proc: Path = PROC, *,
                  include_root: bool = False) -> dict[str, int]:
    """One sample: PSS per service tree (by name) and of the rest of root's tree (REST)."""
    ppids = read_ppids(proc)
    everything = descendants(root, ppids)
    if not include_root:
        everything.discard(root)
    sample, claimed = {}, set()
    for name, pid in services.items():
        tree = descendants(pid, ppids) & everything if pid in everything else set()
        tree -= claimed
        claimed |= tree
        sample[name] = sum(pss_kib(p, proc) for p in tree)
    sample[REST] = sum(pss_kib(p, proc) for p in everything - claimed)
    return sample


class ServiceLog:
    """The services a Tandem run started, read as its coordinator.log grows: name -> pid of the
    latest `service_started` event of each name (a restarted service's new pid)."""

    def __init__(self, path: Path):
        self.path, self._offset, self._pending, self.pids = Path(path), 0, "", {}

    def __call__(self) -> dict[str, int]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as log:
                log.seek(self._offset)
                chunk = log.read()
                self._offset = log.tell()
        except OSError:
            return dict(self.pids)
        lines = (self._pending + chunk).split("\n")
        self._pending = lines.pop()  # an unfinished last line waits for the next read
        for event in parse_events(lines):
            if event.get("event") == "service_started" and "pid" in event:
                self.pids[str(event["name"])] = int(event["pid"])
        return dict(self.pids)


def parse_events(lines: Iterable[str]) -> list[dict]:
    """The JSON objects among log lines (others, and lines cut short, are skipped)."""
    events = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def service_kind(name: str) -> str:
    """A Tandem service's kind from its name: trainer, generator-0 -> generator, reward-arithmetic -> reward."""
    return name.split("-", 1)[0]


def by_kind(sample: dict[str, int], rest: str = REST) -> dict[str, int]:
    """A sample's PSS summed by service kind; REST renamed `rest`."""
    kinds: dict[str, int] = {}
    for name, kib in sample.items():
        kind = rest if name == REST else service_kind(name)
        kinds[kind] = kinds.get(kind, 0) + kib
    return kinds


@dataclass
class Peaks:
    """Peak PSS in KiB: of each group, and of the whole tree (one sample's sum)."""

    groups: dict[str, int] = field(default_factory=dict)
    whole: int = 0
    at_whole: dict[str, int] = field(default_factory=dict)
    """Each group's PSS in the sample of the whole tree's peak."""
    samples: int = 0

    def add(self, sample: dict[str, int]) -> None:
        self.samples += 1
        for name, kib in sample.items():
            self.groups[name] = max(self.groups.get(name, 0), kib)
        total = sum(sample.values())
        if total >= self.whole:
            self.whole, self.at_whole = total, dict(sample)



class TreeSampler:
    """Samples the tree below `root` (default: this process, left out) in a thread while the block
    runs; `peaks` holds the peak of each service kind (REST renamed `rest`) and of the whole tree."""

    def __init__(self, service_pids: Callable[[], dict[str, int]] = dict, root: int | None = None,
                 interval_s: float = 0.5, proc: Path = PROC, rest: str = REST):
        self.root = os.getpid() if root is None else root
        self.service_pids, self.interval_s, self.proc, self.rest = service_pids, interval_s, proc, rest
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pss-sampler", daemon=True)

    def sample(self) -> dict[str, int]:
        sample = by_kind(group_pss_kib(self.root, self.service_pids(), self.proc), self.rest)
        self.peaks.add(sample)
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # at least one sample, however short the block
