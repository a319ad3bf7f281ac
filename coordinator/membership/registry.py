"""Membership: which services are alive, what they serve, and how loaded they are.

Services register (kind, address, fingerprint, capacity, tasks) and heartbeat; a member
silent for longer than `timeout_s` is dropped. A member that announces it is leaving (a
generator told to stop drains first) is no longer `live` (it gets no new work) but is still
`present` (its calls in flight are left to finish) until it says it is gone or goes silent.
One that says it is gone after draining stays `present` for good: its calls finished on its
side, and their streams end by themselves (their last messages may still be on the way when
its goodbye arrives, which must not turn a clean drain into a failure and a re-send).
Thread-safe: the gRPC server thread writes, the run loop reads. Joins, leaves and losses
are logged as structured events.

A member dropped while its process may still be alive (silent for `timeout_s`, or removed by
the run loop) is suspected, not forgotten: a heartbeat it sends later under its member id
brings it back under that id (`member_back`), with its weight version as it reports it. So a
service that misses heartbeats briefly (a stalled host, a paused process resumed) keeps its
identity, while the detection bound stays `timeout_s`: a killed service never heartbeats again,
and one restarted registers anew. An id ends when its member says goodbye (`deregister`) or a
new registration of the same kind at the same address replaces it.

Busy is not dead. Given `vitals` (a local run: the services are this host's processes), a
member silent past `timeout_s` is kept while its process is provably working: it exists, is not
stopped, and used CPU within the last BUSY_WINDOW_S (a long step can starve its heartbeats of
the GIL and the cores). It is dropped once its process is gone or stopped (at timeout_s), idle
(a hang: by timeout_s + BUSY_WINDOW_S), or silent for `busy_grace_s` more (a livelock).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from coordinator.membership.versions import WeightVersions
from coordinator.membership.vitals import Vitals
from tandem.kinds import ServiceKind


@dataclass(frozen=True)
class Member:
    member_id: str
    kind: ServiceKind
    address: str
    model_fingerprint: str = ""
    capacity: int = 0
    tasks: tuple[str, ...] = ()
    pid: int = 0
    shares_trainer_weights: bool = False
    """A generator inside the trainer process (policy.generation.backend: megatron)."""
    weight_version: int = 0
    num_inflight: int = 0
    leaving: bool = False
    """Announced it is leaving: no new work; what it holds may still finish."""
    last_seen: float = field(default_factory=time.monotonic)


def health(member: Member, now: float, heartbeat_interval_s: float, versions: WeightVersions | None) -> str:
    """"leaving", "late" (heartbeat overdue by more than two intervals), "stale_weights" (a
    generator not serving the published version, by WeightVersions' rule: it gets no work until
    brought up to date; None: not judged, e.g. while the run starts) or "healthy"."""
    if member.leaving:
        return "leaving"
    if now - member.last_seen > 2 * heartbeat_interval_s:
        return "late"
    if member.kind is ServiceKind.GENERATOR and versions is not None and not versions.is_current(member.member_id):
        return "stale_weights"
    return "healthy"


def check_announcement(kind: ServiceKind, address: str, capacity: int, tasks: tuple[str, ...], pid: int) -> None:
    """ValueError unless the announcement is one the run can use: a host:port address (port
    1-65535), no negative capacity or pid, and for a reward service the tasks it scores."""
    host, _, port = address.rpartition(":")
    if (not host.strip("[]") or len(address) > 300 or not port.isdigit() or not 0 < int(port) < 65536
            or any(c.isspace() or not c.isprintable() for c in address)):
        raise ValueError(f"address {address[:80]!r} is not host:port (a port from 1 to 65535)")
    if capacity < 0 or pid < 0:
        raise ValueError(f"capacity ({capacity}) and pid ({pid}) cannot be negative")
    if kind is ServiceKind.REWARD and (not tasks or any(not t or len(t) > 200 or not t.isprintable() for t in tasks)):
        raise ValueError("a reward service must name the tasks it scores (non-empty, printable, at most 200 "
                         "characters)")


BUSY_WINDOW_S = 0.5
"""A silent member whose process used no CPU for this long (after timeout_s) is not busy."""

MAX_SUSPECTED = 1024
"""Dropped members remembered for their return (a bound on memory, far above any run's size)."""


class Registry:
    def __init__(self, log, heartbeat_interval_s: float = 1.0, timeout_s: float = 5.0, *,
                 vitals: Callable[[int], Vitals | None] | None = None, busy_grace_s: float = 300.0):
        """vitals(pid): a member's process, read where the coordinator runs (None: silence alone
        decides). busy_grace_s: how long past timeout_s a silent but busy member is kept."""
        self._log = log
        self.heartbeat_interval_s = heartbeat_interval_s
        self.timeout_s = timeout_s
        self._vitals, self._busy_grace_s = vitals, busy_grace_s
        self._busy: dict[str, tuple[float, float]] = {}  # silent member -> (its CPU seconds, when they last grew)
        self._members: dict[str, Member] = {}
        self._drained: set[str] = set()  # left after draining: their calls finished on their side
        self._suspected: dict[str, tuple[Member, float]] = {}  # dropped unheard: member, when dropped
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.run_over = False
        """Set when the run ends: heartbeats tell every member to stop (coordinator/membership/dismiss.py)."""

    def register(self, kind: ServiceKind, address: str, *, model_fingerprint: str = "", capacity: int = 0,
                 tasks: tuple[str, ...] = (), pid: int = 0, shares_trainer_weights: bool = False) -> str:
        """The new member's id; ValueError for an announcement the run could not use."""
        kind = ServiceKind(kind)  # a kind's name ("generator") is one too; ValueError for any other
        check_announcement(kind, address, capacity, tasks, pid)
        with self._lock:
            # The same server came back (e.g. re-registering). One server may hold two kinds
            # (a trainer serving generation), so only a member of the same kind is replaced.
            for old in [m for m in self._members.values() if m.address == address and m.kind == kind]:
                del self._members[old.member_id]
            for old_id in [i for i, (m, _) in self._suspected.items() if m.address == address and m.kind == kind]:
                del self._suspected[old_id]
            member = Member(f"{kind}-{uuid.uuid4().hex[:8]}", kind, address, model_fingerprint, capacity,
                            tuple(tasks), pid, shares_trainer_weights)
            self._members[member.member_id] = member
            self._changed.notify_all()
        self._log.info("member_joined", member_id=member.member_id, kind=kind, address=address,
                       capacity=capacity, tasks=list(tasks))
        return member.member_id

    def heartbeat(self, member_id: str, num_inflight: int, weight_version: int) -> bool:
        """Whether the member is known (False: it must register again). A suspected member's
        heartbeat brings it back under its id, unless (given vitals) its process is gone: a
        heartbeat sent before its death and delivered late (held back by a partition, retransmitted
        by its kernel after the kill) must not bring a dead service back."""
        now = time.monotonic()
        with self._lock:
            member = self._members.get(member_id)
            back = None
            if member is None:
                member, dropped_at = self._suspected.pop(member_id, (None, now))
                if member is None or self._gone(member):
                    return False
                back = now - dropped_at
            self._members[member_id] = replace(member, num_inflight=num_inflight, weight_version=weight_version,
                                               last_seen=now)
            self._busy.pop(member_id, None)
            if back is not None:
                self._changed.notify_all()
        if back is not None:
            self._log.info("member_back", member_id=member_id, kind=member.kind, address=member.address,
                           gone_s=round(back, 3))
        return True

    def deregister(self, member_id: str, *, draining: bool = False) -> None:
        """The member leaves: at once, or (draining) once its work in flight is done: until
        then it keeps heartbeating, gets no new work, and counts as `present`."""
        with self._lock:
            member = self._members.get(member_id)
            if member is None and member_id in self._suspected:  # said goodbye after it was dropped unheard
                member = self._suspected.pop(member_id)[0]
                draining = False  # it is not here to drain
            if member is not None and draining:
                self._members[member_id] = replace(member, leaving=True, last_seen=time.monotonic())
            else:
                self._members.pop(member_id, None)
                if member is not None and member.leaving:
                    self._drained.add(member_id)
            self._changed.notify_all()
        if member is not None:
            self._log.info("member_leaving" if draining else "member_left", member_id=member_id, kind=member.kind,
                           address=member.address, num_inflight=member.num_inflight)

    def remove(self, member_id: str, reason: str, *, may_return: bool = True) -> None:
        """Drop a member the run loop found dead (e.g. its RPCs fail). may_return: its process may
        still be alive, so a heartbeat from it brings it back under its id (False: it was killed;
        then a suspected member is forgotten too: a heartbeat it sent before its death may still
        arrive, e.g. held back by a partition, and must not bring a dead process back)."""
        with self._lock:
            member = self._members.pop(member_id, None)
            self._busy.pop(member_id, None)
            if member is not None and may_return:
                self._suspect(member, time.monotonic())
            if not may_return:
                self._suspected.pop(member_id, None)
            self._changed.notify_all()
        if member is not None:
            self._log.warning("member_lost", member_id=member_id, kind=member.kind, address=member.address,
                              reason=reason)

    def _suspect(self, member: Member, now: float) -> None:
        """Remember a dropped member (under the lock) so that its next heartbeat brings it back;
        the oldest are forgotten past MAX_SUSPECTED (a service that flaps forever stays bounded)."""
        self._suspected[member.member_id] = (member, now)
        while len(self._suspected) > MAX_SUSPECTED:
            del self._suspected[next(iter(self._suspected))]

    def suspected(self) -> list[Member]:
        """Members dropped unheard whose next heartbeat would bring them back (oldest first)."""
        with self._lock:
            return [member for member, _ in self._suspected.values()]

    def live(self, kind: ServiceKind | None = None) -> list[Member]:
        """Members that may get new work (not leaving), sorted by member id."""
        return [m for m in self.members(kind) if not m.leaving]

    def members(self, kind: ServiceKind | None = None) -> list[Member]:
        """Every member still heard from, leaving ones included (what status shows)."""
        now = time.monotonic()
        expired, busy = [], []
        with self._lock:
            for member in list(self._members.values()):
                if now - member.last_seen <= self.timeout_s:
                    continue
                if self._working(member, now):
                    busy.append(member)
                    continue
                expired.append(self._members.pop(member.member_id))
                self._busy.pop(member.member_id, None)
                self._suspect(expired[-1], now)
            alive = [m for m in self._members.values() if kind is None or m.kind == kind]
        for member in busy:
            self._log.debug("member_busy", member_id=member.member_id, kind=member.kind,
                            silent_s=round(now - member.last_seen, 1))
        for member in expired:
            self._log.warning("member_lost", member_id=member.member_id, kind=member.kind, address=member.address,
                              reason=f"no heartbeat for {now - member.last_seen:.0f}s", leaving=member.leaving)
        return sorted(alive, key=lambda m: m.member_id)

    def _gone(self, member: Member) -> bool:
        """(Under the lock) whether the member's process is known to have exited (given vitals)."""
        if self._vitals is None or member.pid <= 0:
            return False
        vitals = self._vitals(member.pid)
        return vitals is None or vitals.state in "ZX"

    def _working(self, member: Member, now: float) -> bool:
        """(Under the lock) whether a member silent past timeout_s is busy rather than gone: its
        process is here, not stopped, and its CPU time grew within BUSY_WINDOW_S."""
        if self._vitals is None or member.pid <= 0 or now - member.last_seen > self.timeout_s + self._busy_grace_s:
            return False
        vitals = self._vitals(member.pid)
        if vitals is None or not vitals.can_work:
            return False
        cpu_s, grew_at = self._busy.get(member.member_id, (vitals.cpu_s, now))  # first look: judged at the next
        if vitals.cpu_s > cpu_s:
            grew_at = now
        self._busy[member.member_id] = (vitals.cpu_s, grew_at)
        return now - grew_at < BUSY_WINDOW_S

    def present(self, member_id: str) -> bool:
        """Whether the member's calls in flight may still finish: it is there (live or draining),
        or it left after draining (they finished on its side)."""
        with self._lock:
            if member_id in self._drained:
                return True
        return any(m.member_id == member_id for m in self.members())

    def wait_for(self, ready, timeout_s: float, check=lambda: None) -> list[Member]:
        """Block until ready(live members) is true; check() may raise (e.g. a child died)."""
        deadline = time.monotonic() + timeout_s
        while True:
            members = self.live()
            if ready(members):
                return members
            check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"services did not register within {timeout_s:.0f}s; live: "
                                   f"{[(m.kind, m.address) for m in members]}")
            with self._lock:
                self._changed.wait(min(remaining, 0.5))
