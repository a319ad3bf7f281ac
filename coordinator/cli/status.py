"""`tandem status`: ask a running coordinator for its members and progress; print them (kind,
address, pid, weight version, load as in-flight/capacity, health, last heartbeat) as a table,
or one block per member in a narrow terminal. With no run in progress it says so plainly.

Where to ask: --coordinator HOST:PORT, else the coordinator.addr of --run-dir, else of the
newest run under ./runs. The token: TANDEM_TOKEN / TANDEM_TOKEN_FILE, else the run's own
(<run>/token), else docker compose's (.tandem/compose/token, made by docker/prepare.sh).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from coordinator.membership.client import CoordinatorClient, RunStatusView
from tandem.kinds import ServiceKind
from tandem.rpc import RpcFailure, TokenMissing, load_token

COMPOSE_TOKEN = Path(".tandem/compose/token")
NARROW = 100
"""Below this many columns members are listed one block each instead of in a table."""


def _latest_run(log_dir: Path) -> Path | None:
    runs = sorted((p for p in log_dir.glob("*") if (p / "coordinator.addr").is_file()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def _reachable(address: str) -> str:
    """An address a server wrote as bound on every interface, as this host reaches it."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "::") else address


def _token(run_dir: Path | None) -> str | None:
    try:
        return load_token()
    except TokenMissing:
        for path in ([run_dir / "token"] if run_dir is not None else []) + [COMPOSE_TOKEN]:
            if path.is_file() and path.read_text().strip():
                return path.read_text().strip()
    return None


def show_status(address: str | None, run_dir: Path | None, console: Console) -> int:
    if address is None:
        run_dir = run_dir or _latest_run(Path("runs"))
        if run_dir is None or not (run_dir / "coordinator.addr").is_file():
            console.print("no run in progress (no runs/<run>/coordinator.addr here): start one with `tandem run`, "
                          "or pass --coordinator HOST:PORT or --run-dir DIR")
            return 1
        address = _reachable((run_dir / "coordinator.addr").read_text().strip())
    token = _token(run_dir)
    if token is None:
        console.print("[red]error:[/] no token for the coordinator: set TANDEM_TOKEN_FILE to the run's token file "
                      "(<run>/token, or .tandem/compose/token for docker compose) or pass --run-dir")
        return 2
    with CoordinatorClient(address, token) as client:
        try:
            status = client.run_status()
        except RpcFailure as exc:
            if exc.status.unreachable:
                finished = run_dir is not None and (run_dir / "summary.json").is_file()
                console.print(f"no run in progress at {address} (nothing answers there)"
                              + (f"; the last run finished: {run_dir / 'summary.json'}" if finished else ""))
                return 1
            console.print(f"[red]error:[/] coordinator at {address}: {exc}")
            return 1
    print_status(status, console)
    return 0


def _weights(kind: ServiceKind | None, version: int) -> str:
    """Generators and trainers serve weight versions; a reward service has none."""
    return f"v{version}" if kind is not None and kind.holds_weights else "-"


def print_status(s: RunStatusView, console: Console) -> None:
    console.print(f"run {s.run_id}: {s.phase} step {s.step}/{s.total_steps}, weights v{s.weight_version}")
    rows = []
    for m in s.members:
        load = f"{m.num_inflight}/{m.capacity}" if m.capacity else str(m.num_inflight)
        kind = f"{m.kind or '?'} ({', '.join(m.tasks)})" if m.tasks else str(m.kind or "?")
        rows.append((m.member_id, kind, m.address, str(m.pid), _weights(m.kind, m.weight_version), load, m.health,
                     f"{m.last_seen_ms_ago} ms ago"))
    headers = ("member", "kind", "address", "pid", "weights", "load", "health", "last seen")
    if console.width < NARROW:
        for row in rows:
            console.print(f"[bold]{row[0]}[/]", highlight=False)
            for name, value in zip(headers[1:], row[1:]):
                console.print(f"  {name:<9} {value}", highlight=False, overflow="fold")
        _print_relaunches(s, console)
        return
    table = Table(*headers)
    for column in table.columns:
        column.overflow = "fold"
    for row in rows:
        table.add_row(*row)
    console.print(table)
    _print_relaunches(s, console)


def _print_relaunches(s: RunStatusView, console: Console) -> None:
    """The services the run relaunched after they died, and how often."""
    if s.service_restarts:
        relaunched = ", ".join(f"{name} x{count}" for name, count in sorted(s.service_restarts.items()))
        console.print(f"relaunched: {relaunched}", highlight=False)
