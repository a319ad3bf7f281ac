"""What a live local `tandem run` leaves in its run directory, read by the fault tests: the
coordinator's events, the GRPO steps logged so far, the launched services' pids, a torchrun
worker by its rank; and the clean-up that kills whatever the run launched."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path


def events(run_dir: Path, name: str = "coordinator") -> list[dict]:
    """The JSON events of `<run>/logs/<name>.log` so far (a line being written is skipped)."""
    path = run_dir / "logs" / f"{name}.log"
    found = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a service's log also holds its libraries' plain output
        if isinstance(event, dict):
            found.append(event)
    return found


def grpo_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [r["step"] for r in rows if r["phase"] == "grpo"]


def services(run_dir: Path) -> dict[str, int]:
    """Service name -> pid of what the run launched (services.json)."""
    return {name: entry["pid"] for name, entry in json.loads((run_dir / "services.json").read_text()).items()}


def torchrun_rank(torchrun_pid: int, rank: int) -> int:
    """The pid of torchrun's worker with RANK=`rank` (its other children, e.g. the JSON log
    forwarder, are not ranks)."""
    for task in Path(f"/proc/{torchrun_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
                return int(child)
    raise AssertionError(f"torchrun (pid {torchrun_pid}) has no rank {rank} worker")


def kill_services(run_dir: Path) -> None:
    """SIGKILL the process group of everything the run launched (a test's clean-up)."""
    if (run_dir / "services.json").is_file():
        for pid in services(run_dir).values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
