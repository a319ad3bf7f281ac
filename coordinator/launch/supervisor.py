"""Keeping a local run's services alive, and saying so while the run waits for one.

A background thread, started once every service has registered and stopped before they are:

- Relaunch. A generator or reward service the run launched that dies (a non-zero exit: a
  crash, a kill; exit code 0 is a service told to stop, and stays stopped) is relaunched by the
  launcher after a backoff (cluster.restart_backoff_s, doubled for each earlier relaunch of that
  service), at most cluster.max_service_restarts times each; then it is given up on (the run
  goes on with the others, or waits for one to join). The trainer is not relaunched here: its
  death (`trainer_dead`, below) sends the loop back to its last checkpoint
  (coordinator/run/grpo_run.py), which relaunches it.
- Stopped services. A service whose process (or any process below it: torchrun's ranks, vLLM's
  engine) has been stopped (SIGSTOP: state T) for stopped_kill_s (cluster.stopped_kill_s) is
  killed, so that it is replaced as above (the trainer: by the loop, from its last checkpoint).
  Stopped for that long means found stopped at every look and never run in between (its
  context switches did not move, `context_switches`): a slow service, stopped and continued over
  and over (benchmarks/chaos.py's slow_generator), makes progress and is left alone, however
  often a look finds it stopped.
  Its heartbeats stop with it, so membership drops it after its timeout (registry.py) and no new
  work goes to it meanwhile; a stop shorter than stopped_kill_s is a pause, and the service goes
  on where it was. So a hang by SIGSTOP is replaced within stopped_kill_s + 2 ticks, plus the
  relaunch (found by benchmarks/chaos.py: a stopped service was waited for forever).
- Notices. While the run lacks a service it needs (no live trainer, no live generator, no
  live reward service for a task), `notify` gets a line saying what is missing and what is
  being done about it, at once and then every notice_period_s, and once more when it is back.

Relaunch counts are the launcher's (`LocalLauncher.restarts`); the run status (and so
`tandem status`) shows them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.launch.adopted import descendants
from coordinator.launch.launcher import LocalLauncher
from coordinator.membership.registry import Member, Registry
from coordinator.membership.status import RunStatus
from coordinator.membership.vitals import context_switches, process_vitals
from tandem.kinds import ServiceKind
from tandem.rpc import RpcFailure


@dataclass(frozen=True)
class Need:
    """A service the run cannot go on without: one of a kind, or (task set) the reward service of a task."""

    kind: ServiceKind
    task: str | None = None

    def met_by(self, live: list[Member]) -> bool:
        return any(m.kind is self.kind and (self.task is None or self.task in m.tasks) for m in live)

    @property
    def names(self) -> str:
        """The start of the launched services' names that serve it: generator-0, ...; reward-math."""
        return f"{self.kind}-{self.task}" if self.task is not None else str(self.kind)


class Supervisor:
    def __init__(self, launcher: LocalLauncher, registry: Registry, status: RunStatus, log, *,
                 needs: Callable[[], dict[str, Need]], notify: Callable[[str], None] | None = None,
                 max_restarts: int = 3, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 notice_period_s: float = 5.0, grace_s: float = 1.0, poll_s: float = 0.25, relaunch: bool = True,
                 stopped_kill_s: float = 30.0, stopped_check_s: float = 1.0):
        """needs(): what the run needs now, as {label: Need}."""
        self._launcher, self._registry, self._status, self._log = launcher, registry, status, log
        self._needs, self._notify = needs, notify or (lambda text: None)
        self._max_restarts, self._backoff_s, self._max_backoff_s = max_restarts, backoff_s, max_backoff_s
        self._notice_period_s, self._grace_s, self._poll_s, self._relaunch = notice_period_s, grace_s, poll_s, relaunch
        self._stopped_kill_s, self._stopped_check_s = stopped_kill_s, stopped_check_s
        self._stopped_since: dict[str, float] = {}  # service name -> since when a process of it has been stopped
        self._stopped_seen: dict[str, dict[int, int | None]] = {}  # service name -> its stopped pids' context switches
        self._stopped_checked = -float("inf")
        self._due: dict[str, float] = {}  # service name -> when to relaunch it
        self._relaunched_at: dict[str, float] = {}  # by whoever relaunched it (here, or a trainer restart)
        self._counts: dict[str, int] = {}  # the launcher's relaunch counts at the last tick
        self._given_up: set[str] = set()
        self._missing_since: dict[str, float] = {}
        self._noticed_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.tick(time.monotonic())
            except Exception as exc:  # the supervisor must outlive a bad tick (it is logged, the run goes on)
                self._log.warning("supervisor_tick_failed", error=f"{type(exc).__name__}: {exc}")

    def tick(self, now: float) -> None:
        if self._relaunch and now - self._stopped_checked >= self._stopped_check_s:
            self._stopped_checked = now
            self._kill_stopped(now)
        if self._relaunch:
            self._relaunch_dead(now)
        counts = dict(self._launcher.restarts)
        if counts != self._counts:
            self._relaunched_at.update({n: now for n, c in counts.items() if c != self._counts.get(n)})
            self._counts = counts
            self._status.update(service_restarts=counts)
        self._announce(now)

    def _relaunch_dead(self, now: float) -> None:
        for name, code in self._launcher.exited_nonessential().items():
            if name in self._given_up or self._stop.is_set():
                continue
            done = self._launcher.restarts.get(name, 0)
            if name not in self._due:
                if code == 0:  # told to stop (SIGTERM: a drain, a swap, scaling down): not a crash
                    self._given_up.add(name)
                    self._say(f"{name} stopped cleanly (exit code 0): not relaunching it", event="service_stopped")
                    continue
                if done >= self._max_restarts:
                    self._given_up.add(name)
                    self._say(f"{name} exited (code {code}) and was relaunched {done} times already "
                              f"(cluster.max_service_restarts): not relaunching it again", event="service_given_up")
                    continue
                delay = min(self._backoff_s * 2 ** done, self._max_backoff_s)
                self._due[name] = now + delay
                self._say(f"{name} exited (code {code}); relaunching it in {delay:g}s "
                          f"(relaunch {done + 1} of {self._max_restarts})", event="service_exited")
            elif now >= self._due[name]:
                del self._due[name]
                self._launcher.restart(name)
                self._log.warning("service_relaunched", name=name, restarts=self._launcher.restarts[name],
                                  pid=self._launcher.pids().get(name))

    def _kill_stopped(self, now: float) -> None:
        """Kill each service with a process stopped for stopped_kill_s (see the module's doc)."""
        for name, pid in self._launcher.pids().items():
            stopped = [p for p in [pid, *descendants(pid)] if (v := process_vitals(p)) is not None and not v.can_work
                       and v.state in "Tt"]
            if not stopped:
                self._stopped_since.pop(name, None)
                self._stopped_seen.pop(name, None)
                continue
            seen, before = {p: context_switches(p) for p in stopped}, self._stopped_seen.get(name, {})
            if any(p not in before or before[p] != switches for p, switches in seen.items()):
                self._stopped_since[name] = now  # newly stopped, or it ran since the last look: a pause at most
            self._stopped_seen[name] = seen
            since = self._stopped_since[name]
            if now - since >= self._stopped_kill_s:
                del self._stopped_since[name], self._stopped_seen[name]
                self._say(f"{name} has been stopped (pids {stopped}, state T) for {now - since:.0f}s "
                          f"(cluster.stopped_kill_s): killing it so that it is replaced", event="service_stopped_too_long")
                self._launcher.kill(name)

    def _announce(self, now: float) -> None:
        live = self._registry.live()
        for label, need in self._needs().items():
            if need.met_by(live):
                if label in self._noticed_at:
                    self._say(f"{label}: back after {now - self._missing_since[label]:.0f}s", event="service_back")
                self._missing_since.pop(label, None)
                self._noticed_at.pop(label, None)
                for name in [n for n in self._relaunched_at if n.startswith(need.names)]:
                    del self._relaunched_at[name]
                continue
            since = self._missing_since.setdefault(label, now)
            last = self._noticed_at.get(label)
            if now - since >= self._grace_s and (last is None or now - last >= self._notice_period_s):
                self._noticed_at[label] = now
                self._say(f"waiting for {label} ({now - since:.0f}s): {self._doing(need, now)}",
                          event="waiting_for_service")

    def _doing(self, need: Need, now: float) -> str:
        """What is being done about a missing kind: the relaunches under way, or nothing."""
        names = sorted(n for n in {*self._due, *self._relaunched_at, *self._given_up} if n.startswith(need.names))
        parts = []
        for name in names:
            if name in self._due:
                parts.append(f"{name} relaunches in {max(0.0, self._due[name] - now):.0f}s")
            elif name in self._given_up:
                parts.append(f"{name} given up after {self._launcher.restarts.get(name, 0)} relaunches")
            else:
                parts.append(f"{name} relaunched {now - self._relaunched_at[name]:.0f}s ago, starting")
        if parts:
            return "; ".join(parts)
        return ("none is live; the run relaunches what it launched as soon as it notices" if self._relaunch
                else "none has registered; start one with --coordinator <this run's address>")

    def _say(self, text: str, *, event: str) -> None:
        self._log.warning(event, message=text)
        self._notify(text)


def trainer_dead(services, launcher, error: BaseException | None = None, grace_s: float = 60.0, *,
                 kind: ServiceKind = ServiceKind.TRAINER) -> bool:
    """Whether the trainer is gone (kind CRITIC: a PPO run's critic, the second trainer service):
    its launched process exited, or it does not answer GetInfo (an error that left it answering
    was not its death). A failed call (`error`) while rank 0 still answers may be the death of
    another rank: its collective broke (e.g. gloo's "Connection reset by peer") and torchrun is
    tearing the rest down, so it counts as dead if its process exits within grace_s."""
    name = str(kind)  # the launched service's name: "trainer", "critic"
    if launcher.exited(name):
        return True
    try:
        services.trainer_of(kind).info()
    except (RpcFailure, RuntimeError):  # RuntimeError: none live in the registry
        return True
    if isinstance(error, RpcFailure) and not error.status.rejects_request:
        return launcher.wait_exit(name, grace_s) is not None
    return False


def dead_trainers(services, launcher, kinds: list[ServiceKind], error: BaseException | None = None,
                  grace_s: float = 60.0, poll_s: float = 0.25) -> list[ServiceKind]:
    """Which of the trainer services `kinds` (the policy's trainer; a PPO run's critic) are gone, as
    `trainer_dead` decides for one: those whose process exited or that do not answer; else, after a
    failed call that may be another rank's death, those whose process exits within grace_s (waited
    for together: the failed call may have been either's)."""
    dead = [k for k in kinds if trainer_dead(services, launcher, kind=k)]
    if dead or not (isinstance(error, RpcFailure) and not error.status.rejects_request):
        return dead
    deadline = time.monotonic() + grace_s
    while not (dead := [k for k in kinds if launcher.exited(str(k))]) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return dead
