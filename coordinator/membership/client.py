"""Typed client of the coordinator's own service (tandem.coordinator.v1), for `tandem status`:
the run's progress and members as plain dataclasses. (Services register and heartbeat through
tandem.membership, the kernel's side of the same contract.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from protos.tandem.coordinator.v1 import coordinator_pb2 as pb
from protos.tandem.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from tandem.convert import from_pb
from tandem.kinds import ServiceKind
from tandem.rpc import open_channel, rpc_failures


@dataclass(frozen=True)
class MemberView:
    member_id: str
    kind: ServiceKind | None
    """None: the coordinator did not say."""
    address: str
    weight_version: int
    num_inflight: int
    last_seen_ms_ago: int
    tasks: tuple[str, ...]
    capacity: int
    pid: int
    health: str


@dataclass(frozen=True)
class RunStatusView:
    run_id: str
    phase: str
    step: int
    total_steps: int
    weight_version: int
    members: tuple[MemberView, ...]
    last_metrics: dict[str, float]
    service_restarts: dict[str, int] = field(default_factory=dict)
    """Relaunches of the services the run launched, by service name."""


def _member(message: pb.Member) -> MemberView:
    fields = {"health": "?", **from_pb(message)}
    kind = fields.pop("kind", None)
    return MemberView(kind=ServiceKind(kind) if kind else None, **fields)


class CoordinatorClient:
    def __init__(self, address: str, token: str | None):
        self.address = address
        self._channel = open_channel(address, token)
        self._stub = pb_grpc.CoordinatorServiceStub(self._channel)

    @rpc_failures
    def run_status(self, timeout_s: float = 5.0) -> RunStatusView:
        reply = self._stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=timeout_s)
        members = tuple(_member(m) for m in reply.members)
        return RunStatusView(**from_pb(reply, skip=("members", "last_metrics", "service_restarts")), members=members,
                             last_metrics=dict(reply.last_metrics), service_restarts=dict(reply.service_restarts))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
