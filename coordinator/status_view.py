"""`tandem status`: ask a running coordinator for its members and progress; print a table
(kind, address, pid, weight version, load as in-flight/capacity, health, last heartbeat)."""

from __future__ import annotations

from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from protos.tandem.coordinator.v1 import coordinator_pb2 as pb
from protos.tandem.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from tandem.rpc import TokenMissing, load_token, open_channel


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
    with open_channel(address, token) as channel:
        try:
            s = pb_grpc.CoordinatorServiceStub(channel).GetRunStatus(pb.GetRunStatusRequest(), timeout=5.0)
        except grpc.RpcError as exc:
            console.print(f"[red]error:[/] coordinator at {address}: {exc.code().name} {exc.details()}")
            return 1
    console.print(f"run {s.run_id}: {s.phase} step {s.step}/{s.total_steps}, weights v{s.weight_version}")
    table = Table("member", "kind", "address", "pid", "weights", "load", "health", "last seen")
    for m in s.members:
        load = f"{m.num_inflight}/{m.capacity}" if m.capacity else str(m.num_inflight)
        table.add_row(m.member_id, pb.ServiceKind.Name(m.kind).removeprefix("SERVICE_KIND_").lower(), m.address,
                      str(m.pid), f"v{m.weight_version}", load,
                      pb.MemberHealth.Name(m.health).removeprefix("MEMBER_HEALTH_").lower(),
                      f"{m.last_seen_ms_ago} ms ago")
    console.print(table)
    return 0
