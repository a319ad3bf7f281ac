"""`tandem status`: ask a running coordinator for its members and progress; print a table
(kind, address, pid, weight version, load as in-flight/capacity, health, last heartbeat)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from coordinator.cluster.client import CoordinatorClient
from tandem.rpc import RpcFailure, TokenMissing, load_token


def _latest_run(log_dir: Path) -> Path | None:
    runs = sorted((p for p in log_dir.glob("*") if (p / "coordinator.addr").is_file()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def show_status(address: str | None, run_dir: Path | None, console: Console) -> int:
    if address is None:
        run_dir = run_dir or _latest_run(Path("runs"))
        if run_dir is None or not (run_dir / "coordinator.addr").is_file():
            console.print("[red]error:[/] no running experiment found; pass --coordinator HOST:PORT or --run-dir")
            return 2
        address = (run_dir / "coordinator.addr").read_text().strip()
    try:
        token = load_token()
    except TokenMissing as exc:
        if run_dir is None or not (run_dir / "token").is_file():
            console.print(f"[red]error:[/] {exc}")
            return 2
        token = (run_dir / "token").read_text().strip()
    with CoordinatorClient(address, token) as client:
        try:
            s = client.run_status()
        except RpcFailure as exc:
            console.print(f"[red]error:[/] coordinator at {address}: {exc}")
            return 1
    console.print(f"run {s.run_id}: {s.phase} step {s.step}/{s.total_steps}, weights v{s.weight_version}")
    table = Table("member", "kind", "address", "pid", "weights", "load", "health", "last seen")
    for m in s.members:
        load = f"{m.num_inflight}/{m.capacity}" if m.capacity else str(m.num_inflight)
        table.add_row(m.member_id, m.kind, m.address, str(m.pid), f"v{m.weight_version}", load, m.health,
                      f"{m.last_seen_ms_ago} ms ago")
    console.print(table)
    if s.service_restarts:
        relaunched = ", ".join(f"{name} x{count}" for name, count in sorted(s.service_restarts.items()))
        console.print(f"relaunched: {relaunched}")
    return 0
