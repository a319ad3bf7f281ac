"""The nemesis's faults (benchmarks/chaos.py): their kinds, a schedule drawn from a seed, and the
helpers that hold a process stopped or slow. The module doc of benchmarks/chaos.py says what each
kind does."""

from __future__ import annotations

import enum
import os
import random
import signal
import time
from dataclasses import dataclass

from benchmarks.chaos_check import process_state


class FaultKind(enum.Enum):
    GENERATOR_KILL = "generator_kill"
    GENERATOR_HANG = "generator_hang"
    REWARD_KILL = "reward_kill"
    REWARD_HANG = "reward_hang"
    RANK_KILL = "rank_kill"
    RANK_HANG = "rank_hang"
    AGENT_KILL = "agent_kill"
    AGENT_HANG = "agent_hang"
    COORDINATOR_KILL = "coordinator_kill"
    COORDINATOR_HANG = "coordinator_hang"
    DISK_FULL = "disk_full"
    PARTITION = "partition"
    SLOW_GENERATOR = "slow_generator"

    @property
    def hang(self) -> bool:
        return self.value.endswith("_hang")

    @property
    def lasts(self) -> bool:
        """A fault with a duration (hang_s): a hang, a full disk, a partition, a slow generator."""
        return self.hang or self in (FaultKind.DISK_FULL, FaultKind.PARTITION, FaultKind.SLOW_GENERATOR)

    @property
    def sandboxed(self) -> bool:
        """Needs the run in a sandbox (benchmarks/chaos_sandbox.py): a disk or a network of its own."""
        return self in (FaultKind.DISK_FULL, FaultKind.PARTITION)


SIGNALLED = [k for k in FaultKind if not k.sandboxed]
"""The kinds that signal a process (the full disk needs a run on a small filesystem: `Nemesis(disk_mb=...)`;
a partition a network of its own: chaos_net.network_available says whether one can be made here)."""

PARTITIONED = ("generator-0", "reward-arithmetic", "trainer")
"""The services a partition may cut off (their names in <run>/services.json)."""
SLOW_STOP_S, SLOW_RUN_S = 0.3, 0.1
"""A slow generator's duty cycle: stopped this long, then running this long, over and over."""


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    delay_s: float
    """After the run recovered from the previous fault (the first: after GRPO step 1)."""
    hang_s: float = 0.0
    """SIGSTOP -> SIGCONT (hangs), how long the disk stays full (DISK_FULL), the service is cut
    off (PARTITION) or the generator slow (SLOW_GENERATOR)."""
    rank: int = 0
    """The trainer rank (rank faults only)."""
    service: str = ""
    """The service cut off (PARTITION only): one of PARTITIONED."""
    startup: bool = False
    """Fired delay_s after the run was launched, while it starts (before GRPO step 1)."""


def schedule(seed: int, count: int, rate_per_min: float, kinds: list[FaultKind], *, max_hang_s: float = 8.0,
             ranks: int = 2) -> list[Fault]:
    """`count` faults drawn from `seed`: every kind once in a shuffled order first (so a short run
    covers them all), then kinds at random; delays exponential with mean 60/rate_per_min s."""
    rng = random.Random(seed)
    order = rng.sample(kinds, len(kinds)) + [rng.choice(kinds) for _ in range(max(0, count - len(kinds)))]
    faults = []
    for kind in order[:count]:
        faults.append(Fault(kind, round(rng.expovariate(rate_per_min / 60.0), 2),
                            round(rng.uniform(1.0, max_hang_s), 2) if kind.lasts else 0.0, rng.randrange(ranks),
                            rng.choice(PARTITIONED) if kind is FaultKind.PARTITION else ""))
    return faults


SERVICE_OF = {FaultKind.GENERATOR_KILL: "generator-0", FaultKind.GENERATOR_HANG: "generator-0",
            FaultKind.SLOW_GENERATOR: "generator-0", FaultKind.REWARD_KILL: "reward-arithmetic",
            FaultKind.REWARD_HANG: "reward-arithmetic", FaultKind.RANK_KILL: "trainer", FaultKind.RANK_HANG: "trainer",
            FaultKind.AGENT_KILL: "trainer", FaultKind.AGENT_HANG: "trainer"}
"""The service (its name in services.json) each kind hits; a partition names its own (Fault.service)."""


def replaced(before: dict[str, int], after: dict[str, int], name: str) -> bool:
    """Whether the service `name` was relaunched meanwhile (a new pid in services.json)."""
    return bool(name) and name in before and before.get(name) != after.get(name)


def hold_stopped(pid: int, hang_s: float, since: float) -> float | None:
    """Keep `pid` stopped for hang_s (from `since`) unless the run kills it first: then the seconds
    from `since` to its death (None: it lived through the hang)."""
    while time.monotonic() - since < hang_s:
        if process_state(pid) in "ZX":
            return round(time.monotonic() - since, 2)
        time.sleep(0.05)
    return None


def slow_down(pgid: int, duration_s: float) -> int | None:
    """Run the process group `pgid` SLOW_RUN_S out of every SLOW_STOP_S + SLOW_RUN_S for
    duration_s; the cycles done (None: it was killed meanwhile)."""
    end, cycles = time.monotonic() + duration_s, 0
    try:
        while time.monotonic() < end:
            os.killpg(pgid, signal.SIGSTOP)
            time.sleep(SLOW_STOP_S)
            os.killpg(pgid, signal.SIGCONT)
            time.sleep(SLOW_RUN_S)
            cycles += 1
    except ProcessLookupError:
        return None
    finally:
        try:
            os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return cycles
