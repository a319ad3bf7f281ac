"""The membership agent every service runs: register with the coordinator, then heartbeat.

A coordinator that stops answering is logged once (`coordinator_lost`); the agent keeps
trying every interval. A heartbeat answered with `known=False` (the coordinator restarted,
on the same address) registers again (`coordinator_back`), so live services re-join a
restarted coordinator without restarting themselves.

A heartbeat answered with `run_over` (the run finished: services that the run did not start
itself end with it) calls `on_run_over` once; the service then stops as on SIGTERM. A
coordinator unreachable for `give_up_after_s` (never reached, or lost: a run that ended before
this service joined, or died and was not restarted) calls `on_gone` once and the agent stops
trying, so a service started for a run that is gone ends instead of retrying forever.

Leaving is two-step: `leave()` tells the coordinator the service is draining (no new work;
heartbeats go on so its load stays visible), `stop()` says it is gone.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from protos.tandem.coordinator.v1 import coordinator_pb2 as pb
from protos.tandem.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from tandem.convert import enum_to_pb
from tandem.kinds import ServiceKind
from tandem.rpc import TOKEN_METADATA_KEY

CALL_TIMEOUT_S = 5.0


@dataclass
class Announcement:
    """What a service tells the coordinator about itself."""

    kind: ServiceKind
    address: str
    model_fingerprint: str = ""
    capacity: int = 0
    tasks: list[str] = field(default_factory=list)
    shares_trainer_weights: bool = False
    """A generator served by the trainer process from its own weights (nothing to transfer)."""


@dataclass
class Load:
    """What a heartbeat reports."""

    num_inflight: int = 0
    weight_version: int = 0


class MembershipAgent:
    """Registers, heartbeats, re-registers on demand, and deregisters on stop.

    Every call to the coordinator is made on a thread of its own (`membership`), with a blocking
    gRPC channel: nothing the service's event loop or its engine thread does (a train step of
    minutes, sync work on the loop) sits between two heartbeats. A blocking gRPC call holds
    no GIL while it waits, and the thread does no other work, so the only thing it needs from a
    busy process is a few milliseconds of the GIL per interval. `on_run_over` and `on_gone` run
    on the event loop that called `start()`."""

    def __init__(self, coordinator_address: str, token: str, announcement: Announcement,
                 load: Callable[[], Load], log, on_run_over: Callable[[], None] | None = None, *,
                 give_up_after_s: float = 0.0, on_gone: Callable[[], None] | None = None) -> None:
        """give_up_after_s: 0 waits for an unreachable coordinator forever."""
        self._address = coordinator_address
        self._metadata = ((TOKEN_METADATA_KEY, token),)
        self._announcement = announcement
        self._load = load
        self._last_load = Load()
        self._log = log
        self._member_id: str | None = None
        self._interval_s = 1.0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one call to the coordinator at a time (the thread's, or a goodbye)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: grpc.Channel | None = None
        self._leaving = False
        self._unreachable_since: float | None = None
        self._on_run_over = on_run_over
        self._give_up_after_s, self._on_gone = give_up_after_s, on_gone

    def start(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # no event loop: the callbacks run on the agent's thread
        self._channel = grpc.insecure_channel(self._address)
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until the agent stopped trying (stop(), or the coordinator gone); True if it did."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self._thread is None or not self._thread.is_alive()

    def _run(self) -> None:
        stub = pb_grpc.CoordinatorServiceStub(self._channel)
        while not self._stopping.is_set():
            try:
                with self._lock:
                    if self._stopping.is_set():
                        return
                    if self._member_id is None and not self._leaving:
                        self._register(stub)
                    elif self._member_id is not None:
                        self._heartbeat(stub)
                self._reachable()
            except grpc.RpcError as exc:
                self._unreachable(exc)
                if self._gone():
                    return
            self._stopping.wait(self._interval_s)

    def _register(self, stub: pb_grpc.CoordinatorServiceStub) -> None:
        a = self._announcement
        reply = stub.Register(pb.RegisterRequest(
            kind=enum_to_pb(pb.ServiceKind.DESCRIPTOR, a.kind), address=a.address, model_fingerprint=a.model_fingerprint, capacity=a.capacity,
            tasks=a.tasks, pid=os.getpid(), shares_trainer_weights=a.shares_trainer_weights), metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        self._member_id = reply.member_id
        self._interval_s = max(reply.heartbeat_interval_ms, 100) / 1000
        self._log.info("registered", coordinator=self._address, member_id=self._member_id)

    def _heartbeat(self, stub: pb_grpc.CoordinatorServiceStub) -> None:
        try:
            self._last_load = self._load()
        except Exception as exc:  # noqa: BLE001 - a heartbeat goes out even when the load cannot be read
            self._log.warning("load_unreadable", error=f"{type(exc).__name__}: {exc}")
        load = self._last_load
        reply = stub.Heartbeat(pb.HeartbeatRequest(
            member_id=self._member_id, num_inflight=load.num_inflight, weight_version=load.weight_version),
            metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        if reply.run_over and self._on_run_over is not None:
            self._log.info("run_over", coordinator=self._address)
            self._call_back(self._on_run_over)
            self._on_run_over = None
        if not reply.known:
            self._log.warning("coordinator_forgot_member", member_id=self._member_id, leaving=self._leaving)
            self._member_id = None  # register again at once (unless leaving: then stay away)
            if not self._leaving:
                self._register(stub)

    def _call_back(self, callback: Callable[[], None]) -> None:
        """Run a callback on the service's event loop (it may set asyncio events)."""
        if self._loop is None or self._loop.is_closed():
            callback()
        else:
            self._loop.call_soon_threadsafe(callback)

    def _unreachable(self, exc: grpc.RpcError) -> None:
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            event = "coordinator_lost" if self._member_id is not None else "coordinator_unreachable"
            self._log.warning(event, coordinator=self._address, code=exc.code().name)

    def _gone(self) -> bool:
        """Unreachable for longer than give_up_after_s: say so, tell on_gone, stop trying."""
        waited = time.monotonic() - self._unreachable_since  # set by _unreachable, just before
        if not self._give_up_after_s or waited < self._give_up_after_s:
            return False
        self._log.warning("coordinator_gone", coordinator=self._address, unreachable_s=round(waited, 1),
                          message=f"no coordinator answered at {self._address} for {waited:.0f}s: this service stops "
                                  "(start it again once the run is up; --coordinator-wait-s 0 waits forever)")
        if self._on_gone is not None:
            self._call_back(self._on_gone)
        return True

    def _reachable(self) -> None:
        if self._unreachable_since is not None:
            self._log.info("coordinator_back", coordinator=self._address, member_id=self._member_id,
                           unreachable_s=round(time.monotonic() - self._unreachable_since, 3))
            self._unreachable_since = None

    async def leave(self) -> None:
        """Tell the coordinator this service is draining: no new work from now on."""
        self._leaving = True
        await asyncio.to_thread(self._deregister, True)

    def _deregister(self, draining: bool) -> None:
        with self._lock:  # not beside a heartbeat whose reply would register it again
            if self._member_id is None or self._channel is None:
                return
            try:
                pb_grpc.CoordinatorServiceStub(self._channel).Deregister(
                    pb.DeregisterRequest(member_id=self._member_id, draining=draining), metadata=self._metadata,
                    timeout=2.0)
            except grpc.RpcError:
                pass  # the coordinator is gone; its heartbeat timeout will notice

    async def stop(self) -> None:
        """Say the service is gone and stop heartbeating."""
        self._leaving = True
        self._stopping.set()
        await asyncio.to_thread(self._deregister, False)
        await asyncio.to_thread(self.join, CALL_TIMEOUT_S + 1)
        if self._channel is not None:
            self._channel.close()
