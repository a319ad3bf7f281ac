"""Weight versions and publishing: the trainer broadcasts version v+1 to every live
generator over a weight-sync group; a membership change starts a new epoch (a new group
under a new PrefixStore and a fresh admission secret)."""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tandem.weight_sync import BucketPlan, GroupSpec


@dataclass(frozen=True)
class PublishReport:
    version: int
    epoch: int
    num_generators: int
    bytes_sent: int
    duration_s: float


class WeightPublisher:
    def __init__(self, trainer, store_address: str, plan: BucketPlan, log, *, op_timeout_s: float = 30.0,
                 version: int = 0):
        self._trainer = trainer
        self._store_address = store_address
        self._plan = plan
        self._log = log
        self._op_timeout_s = op_timeout_s
        self.version = version
        self._epoch = -1
        self._members: tuple[str, ...] = ()
        self._secret = ""

    def _group_for(self, member_ids: tuple[str, ...]) -> GroupSpec:
        if member_ids != self._members:
            self._epoch += 1
            self._members = member_ids
            self._secret = secrets.token_hex(8)
            self._log.info("weight_sync_epoch", epoch=self._epoch, generators=list(member_ids))
        return GroupSpec(self._store_address, self._epoch, self._secret, 1 + len(member_ids), self._op_timeout_s)

    def publish(self, generators: list) -> PublishReport:
        """Broadcast the trainer's weights as version+1 to `generators` (GeneratorHandle list)."""
        if not generators:
            raise ValueError("no generator to publish to")
        group = self._group_for(tuple(g.member_id for g in generators))
        version = self.version + 1
        start = time.perf_counter()
        timeout_s = self._op_timeout_s * (2 + len(self._plan.bucket_sizes_bytes))
        with ThreadPoolExecutor(1 + len(generators)) as pool:
            sent = pool.submit(self._trainer.publish_weights, group, version)
            received = [pool.submit(g.client.receive_weights, group, rank, version, self._plan, timeout_s)
                        for rank, g in enumerate(generators, start=1)]
            try:
                report = sent.result()
                for future in received:
                    future.result()
            except Exception:
                self._members = ()  # force a fresh group (new epoch) next time
                raise
        self.version = version
        duration = time.perf_counter() - start
        self._log.info("weights_published", version=version, epoch=group.epoch, generators=len(generators),
                       bytes=report.bytes_sent, seconds=round(duration, 3))
        return PublishReport(version, group.epoch, len(generators), report.bytes_sent, duration)
