"""How a run shows its progress, wherever its output goes.

In a terminal: rich bars per phase and a spinner while services start. Anywhere else (a pipe,
`| tee`, CI, `docker logs`): plain timestamped lines, so a reader sees the run move during the
start-up wait, SFT, GRPO, validations and checkpoints, at a sensible rate: the first and the
last step of a phase, then at most one line every `interval_s` (TANDEM_PROGRESS_INTERVAL_S,
default 10 s); a start-up wait says who has registered every `interval_s`.

    progress = RunProgress(console)
    with progress.waiting("starting services", lambda: "trainer 1/1, generators 0/2"):
        ...                                          # blocks; the description is polled
    with progress.phase("grpo", total=60) as bar:
        bar.update(3, "loss 0.12  reward 0.50")
    progress.note("checkpoint at GRPO step 20 (1.2s)")

While the services start, describe_startup says in words what the run waits for:
"trainer 1/1, generators 1/2, rewards 0/1 (waiting: arithmetic)".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from coordinator.config import ExperimentConfig
from coordinator.membership.registry import Member
from tandem.kinds import ServiceKind


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunProgress:
    def __init__(self, console: Console, interval_s: float | None = None, tty: bool | None = None):
        self.console = console
        self.tty = console.is_terminal if tty is None else tty
        self.interval_s = interval_s if interval_s is not None else float(
            os.environ.get("TANDEM_PROGRESS_INTERVAL_S", "10"))

    def note(self, text: str) -> None:
        """One line: as is in a terminal, timestamped elsewhere."""
        if self.tty:
            self.console.print(text, highlight=False)
        else:
            self._plain(Text.from_markup(text).plain)

    def _plain(self, text: str) -> None:
        file = self.console.file
        file.write(f"{datetime.now():%Y-%m-%d %H:%M:%S} {text}\n")
        file.flush()

    @contextmanager
    def waiting(self, what: str, describe: Callable[[], str]) -> Iterator[None]:
        """While the block runs: a spinner with `describe()` in a terminal; otherwise a line now
        and one every interval_s, each with the time waited and `describe()`."""
        started = time.monotonic()

        def text() -> str:
            detail = describe()
            return f"{what} ({time.monotonic() - started:.0f}s){': ' + detail if detail else ''}"

        if self.tty:
            with self.console.status(f"{what}...") as status, _repeating(self._spin, status, text):
                yield
            return
        self._plain(text())
        with _repeating(self._tick, text):
            yield

    def _spin(self, status, text: Callable[[], str], done: threading.Event) -> None:
        while not done.wait(1.0):
            status.update(text())

    def _tick(self, text: Callable[[], str], done: threading.Event) -> None:
        while not done.wait(self.interval_s):
            self._plain(text())

    @contextmanager
    def phase(self, name: str, total: int, completed: int = 0, unit: str = "step") -> Iterator[PhaseBar]:
        if self.tty:
            columns = [TextColumn(f"[bold]{name:>4}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.description}")]
            with Progress(*columns, console=self.console, transient=False) as progress:
                yield PhaseBar(name, total, completed, unit, progress=progress)
        else:
            yield PhaseBar(name, total, completed, unit, plain=self._plain, interval_s=self.interval_s)


class PhaseBar:
    """One phase's progress: a rich task, or throttled plain lines."""

    def __init__(self, name: str, total: int, completed: int, unit: str, *, progress: Progress | None = None,
                 plain: Callable[[str], None] | None = None, interval_s: float = 10.0):
        self.name, self.total, self.completed, self.unit = name, total, completed, unit
        self._progress, self._plain, self._interval_s = progress, plain, interval_s
        self._task = progress.add_task("", total=total, completed=completed) if progress is not None else None
        self._started, self._first = time.monotonic(), completed
        self._last_line: float | None = None

    def update(self, completed: int, description: str = "", total: int | None = None) -> None:
        """Now at `completed` of `total` (a phase that stops early gives its new total)."""
        self.completed = completed
        self.total = self.total if total is None else total
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, total=self.total, description=description)
            return
        now = time.monotonic()
        if self._last_line is not None and completed < self.total and now - self._last_line < self._interval_s:
            return
        self._last_line = now
        self._plain(self.line(description, now))

    def line(self, description: str, now: float) -> str:
        elapsed = now - self._started
        done = self.completed - self._first
        left = elapsed / done * (self.total - self.completed) if done > 0 else None
        share = f" ({self.completed / self.total:.0%})" if self.total else ""
        timing = f"{_clock(elapsed)} elapsed" + (f", ~{_clock(left)} left" if left and self.completed < self.total else "")
        return (f"{self.name} {self.unit} {self.completed}/{self.total}{share}  {timing}"
                + (f"  | {description}" if description else ""))


@contextmanager
def _repeating(target: Callable[..., None], *args) -> Iterator[None]:
    """`target(*args, done)` in a daemon thread while the block runs; `done` is set at its end."""
    done = threading.Event()
    thread = threading.Thread(target=target, args=(*args, done), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=2)


def expected_services(cfg: ExperimentConfig) -> tuple[int, list[str]]:
    """(generators, reward tasks) the run waits for beside its trainer."""
    plan = cfg.service_plan
    return plan.generators, sorted(plan.reward_tasks)


def describe_startup(cfg: ExperimentConfig, members: list[Member], trainer: bool = True) -> str:
    generators, tasks = expected_services(cfg)
    kinds = [m.kind for m in members]
    parts = [f"trainer {min(kinds.count(ServiceKind.TRAINER), 1)}/1"] if trainer else []
    if trainer and cfg.service_plan.critic_ranks:
        parts.append(f"critic {min(kinds.count(ServiceKind.CRITIC), 1)}/1")
    if generators:
        parts.append(f"generators {min(kinds.count(ServiceKind.GENERATOR), generators)}/{generators}")
    if tasks:
        served = {t for m in members if m.kind is ServiceKind.REWARD for t in m.tasks}
        missing = [t for t in tasks if t not in served]
        parts.append(f"rewards {len(tasks) - len(missing)}/{len(tasks)}"
                     + (f" (waiting: {', '.join(missing)})" if missing else ""))
    return ", ".join(parts)
