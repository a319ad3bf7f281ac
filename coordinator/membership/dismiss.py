"""The end of a run, for services it did not start (compose, other hosts): every heartbeat is
answered "the run is over", on which a service stops as on SIGTERM (drains, leaves, exits 0;
tandem/membership.py, tandem/service.py); the coordinator waits, bounded, until they have left.
Services it launched itself are stopped by their process group instead (launcher.py)."""

from __future__ import annotations

import time

from coordinator.membership.registry import Registry


def dismiss_services(registry: Registry, timeout_s: float, log, poll_s: float = 0.2) -> list[str]:
    """Tell every member the run is over and wait until none is left (those silent past the
    membership timeout are dropped); returns the ids of those still there after timeout_s."""
    registry.run_over = True
    waiting = [m.member_id for m in registry.members()]
    log.info("dismissing_services", members=waiting)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = [m.member_id for m in registry.members()]
        if not waiting:
            break
        time.sleep(poll_s)
    log.info("services_dismissed", still_there=waiting)
    return waiting
