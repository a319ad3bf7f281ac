"""The run's progress as the status RPC reports it (written by the run loop, read by the
coordinator's server thread)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from coordinator.membership.versions import WeightVersions


@dataclass
class RunStatus:
    run_id: str
    versions: WeightVersions = field(default_factory=WeightVersions)
    """The run's weight versions (the publisher writes them): the published version, and who is stale."""
    phase: str = "starting"
    step: int = 0
    total_steps: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    service_restarts: dict[str, int] = field(default_factory=dict)
    """Relaunches of the services the run launched, by name (trainer restarts included)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, **changes) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self, key, value)

    def snapshot(self) -> dict:
        with self._lock:
            return {"run_id": self.run_id, "phase": self.phase, "step": self.step, "total_steps": self.total_steps,
                    "weight_version": self.versions.version, "last_metrics": dict(self.last_metrics),
                    "service_restarts": dict(self.service_restarts)}
