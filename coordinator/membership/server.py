"""gRPC transport of the coordinator's membership/status API, served from a background
thread with its own event loop (the run loop itself is synchronous)."""

from __future__ import annotations

import asyncio
import threading
import time

from coordinator.membership.registry import Registry, health
from coordinator.membership.status import RunStatus
from protos.tandem.coordinator.v1 import coordinator_pb2 as pb
from protos.tandem.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from tandem.convert import enum_from_pb, enum_to_pb
from tandem.kinds import ServiceKind
from tandem.rpc import RunningServer, start_server

SERVICE_NAME = "tandem.coordinator.v1.CoordinatorService"
_KIND = pb.ServiceKind.DESCRIPTOR


class CoordinatorServicer(pb_grpc.CoordinatorServiceServicer):
    def __init__(self, registry: Registry, status: RunStatus):
        self._registry = registry
        self._status = status

    async def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterResponse:
        kind = enum_from_pb(_KIND, request.kind)
        if kind is None or not request.address:
            raise ValueError("register needs a service kind and an address")
        member_id = self._registry.register(
            ServiceKind(kind), request.address, model_fingerprint=request.model_fingerprint,
            capacity=request.capacity, tasks=tuple(request.tasks), pid=request.pid,
            shares_trainer_weights=request.shares_trainer_weights)
        return pb.RegisterResponse(member_id=member_id,
                                   heartbeat_interval_ms=int(self._registry.heartbeat_interval_s * 1000))

    async def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.HeartbeatResponse:
        known = self._registry.heartbeat(request.member_id, request.num_inflight, request.weight_version)
        return pb.HeartbeatResponse(known=known, run_over=self._registry.run_over)

    async def Deregister(self, request: pb.DeregisterRequest, context) -> pb.DeregisterResponse:
        self._registry.deregister(request.member_id, draining=request.draining)
        return pb.DeregisterResponse()

    async def GetRunStatus(self, request: pb.GetRunStatusRequest, context) -> pb.GetRunStatusResponse:
        s = self._status.snapshot()
        now, interval = time.monotonic(), self._registry.heartbeat_interval_s
        versions = self._status.versions if s["phase"] not in ("starting", "resuming") else None
        members = [pb.Member(member_id=m.member_id, kind=enum_to_pb(_KIND, m.kind), address=m.address,
                             weight_version=m.weight_version, num_inflight=m.num_inflight,
                             last_seen_ms_ago=int((now - m.last_seen) * 1000), tasks=list(m.tasks),
                             capacity=m.capacity, pid=m.pid,
                             health=enum_to_pb(pb.MemberHealth.DESCRIPTOR, health(m, now, interval, versions)))
                   for m in self._registry.members()]
        return pb.GetRunStatusResponse(run_id=s["run_id"], phase=s["phase"], step=s["step"],
                                       total_steps=s["total_steps"], weight_version=s["weight_version"],
                                       members=members, last_metrics=s["last_metrics"],
                                       service_restarts=s["service_restarts"])


class CoordinatorServer:
    """Runs the coordinator's aio server on a daemon thread."""

    def __init__(self, registry: Registry, status: RunStatus, *, host: str, port: int, token: str, log):
        self._args = (registry, status, host, port, token, log)
        self._loop = asyncio.new_event_loop()
        self._running: RunningServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="coordinator-grpc", daemon=True)

    def start(self) -> str:
        registry, status, host, port, token, log = self._args
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(start_server(
            [lambda s: pb_grpc.add_CoordinatorServiceServicer_to_server(CoordinatorServicer(registry, status), s)],
            [SERVICE_NAME], host=host, port=port, token=token, log=log), self._loop)
        self._running = future.result(timeout=30)
        asyncio.run_coroutine_threadsafe(self._running.mark_ready(), self._loop).result(timeout=10)
        return self._running.address

    def stop(self) -> None:
        """Stop serving; safe to call more than once."""
        if not self._thread.is_alive():
            return
        if self._running is not None:
            asyncio.run_coroutine_threadsafe(self._running.stop(grace_s=1.0), self._loop).result(timeout=10)
            self._running = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
