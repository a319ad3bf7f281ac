"""Running a run from the command line: Ctrl-C and SIGTERM stop every service it started, and
the errors a user can act on are one line instead of a traceback."""

from __future__ import annotations

import signal

from rich.console import Console
from rich.markup import escape


def execute(run, console: Console) -> tuple[int, dict | None]:
    """Run it; (exit code, summary or None)."""
    from coordinator.launch.launcher import ServiceDied
    from coordinator.launch.local import AddressTaken
    from coordinator.loop.drift import DriftError

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return 0, run.execute()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every service was stopped[/]")
        return 130, None
    except (ServiceDied, AddressTaken, TimeoutError, DriftError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}\n(every service this run started was stopped)")
        return 1, None
