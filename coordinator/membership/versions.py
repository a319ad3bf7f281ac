"""The published weight version and which generators serve it: the one place that says whether
a generator is stale. The weight publisher (coordinator/loop/weights/publisher.py) writes it;
admission to rollouts and the health that `tandem status` shows read it.

A generator is current when it acknowledged the published version (a publish to it succeeded),
or when nothing was published yet (version 0: every generator loads the trainer's initial
checkpoint from disk). A stale one gets no work until a publish brings it up to date.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class WeightVersions:
    """Thread-safe: the run loop writes, the status server reads."""

    def __init__(self, version: int = 0):
        self._version = version
        self._current: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """The version last published (0: the initial checkpoint)."""
        return self._version

    def is_current(self, member_id: str) -> bool:
        with self._lock:
            return self._version == 0 or member_id in self._current

    def published(self, version: int, acknowledged: Iterable[str]) -> None:
        """`version` was published; exactly `acknowledged` serve it."""
        if version < self._version:
            raise ValueError(f"version {version} is older than the published version {self._version}")
        with self._lock:
            self._version, self._current = version, frozenset(acknowledged)

    def caught_up(self, acknowledged: Iterable[str]) -> None:
        """More generators now serve the published version (a catch-up publish to them)."""
        with self._lock:
            self._current = self._current | frozenset(acknowledged)

    def forget(self, member_id: str) -> None:
        """The member is gone or failed: it serves nothing known any more."""
        with self._lock:
            self._current = self._current - {member_id}
