"""The rollout pipeline of GRPO: one producer that rolls out the steps' batches in order, and
the step loop that takes them. Synchronous and asynchronous GRPO are this one pipeline with a
different bound on a trajectory's age (`grpo.async_grpo.max_trajectory_age_steps`; 0 when async
is off).

A batch for step s may be produced once the weights of step s - 1 - max_age are published (so
it is sampled by weights at most max_age versions behind the ones that train on it: each step
publishes one version, and generators serve only the published version, loop/context.py) and
the loop has asked for step s - max_age. With max_age 0 the producer starts batch s only when
step s asks for it, after step s - 1 published, validated and checkpointed: rollout, train and
publish strictly alternate, exactly the synchronous step. With max_age k it runs up to k
batches ahead while the trainer trains, and generators swap weights between its calls.

Every group is checked again when its step takes it (age = the version the trainer holds then,
published or still on its way to the generators, - the oldest version that sampled any of its
episodes); one older than the bound is dropped (never trained on), counted, and its prompt
sampled again by the current weights (`resample`: never a fresh prompt, which would be drawn
beyond the cursor that later batches and the checkpoints hold, so a resume drew it again and
trained it twice). Each batch keeps the data cursor's state after its prompts were drawn, so a
checkpoint of step s resumes from the prompts after batch s even when later batches were
already drawn. Each taken batch leaves its step's ledger record (loop/ledger.py: the samples it
trains, their versions, the groups dropped and why): `samples_of(step)`.

The producer runs on a thread of its own: an error there (a dead trainer, dynamic sampling
exhausted) is raised by the `take` of the step it was producing. Stopping sets `stopping`, the
event the producer's waits for a missing service watch (LoopContext.pause), so a stop (Ctrl-C,
SIGTERM, a requeue) never waits for a reward service or generator that is not coming back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.loop.groups import RolloutGroups
from coordinator.loop.ledger import DropReason, StepSamples


@dataclass
class RolloutBatch:
    """One step's prompt groups and what producing them measured."""

    step: int
    rollouts: RolloutGroups
    metrics: dict[str, float]
    cursor_after: dict[str, int] = field(default_factory=dict)
    """The data cursor's state right after this batch's prompts were drawn (for checkpoints)."""


Produce = Callable[[int, int], tuple[RolloutGroups, dict[str, float]]]
"""(step, number of prompt groups) -> the step's groups and their metrics (dynamic sampling inside)."""
Resample = Callable[[int, RolloutGroups], RolloutGroups]
"""(step, stale groups) -> the same prompts sampled and scored again by the current weights."""


class RolloutPipeline:
    def __init__(self, produce: Produce, num_groups: int, *, resample: Resample, max_age: int,
                 trainer_version: Callable[[], int], cursor_state: Callable[[], dict[str, int]], log,
                 stopping: threading.Event | None = None):
        if max_age < 0:
            raise ValueError(f"max_age must be >= 0, got {max_age}")
        self._produce, self._resample, self._num_groups, self.max_age = produce, resample, num_groups, max_age
        self._trainer_version, self._cursor_state, self._log = trainer_version, cursor_state, log
        self._changed = threading.Condition()
        self._stop_waits = stopping or threading.Event()
        self._produce_lock = threading.Lock()  # the data cursor is drawn by one producer at a time
        self._batches: dict[int, RolloutBatch] = {}
        self._errors: dict[int, BaseException] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._next = self._last = self._published = self._asked = 0
        self._cursors: dict[int, dict[str, int]] = {}  # step -> cursor after its batch, for taken steps
        self._ledger: dict[int, StepSamples] = {}  # step -> the samples it trains, for taken steps

    def start(self, first_step: int, last_step: int) -> None:
        """Produce the batches of steps first_step..last_step (step first_step - 1 counts as published)."""
        self.stop()
        self._next, self._last = first_step, last_step
        self._published, self._asked, self._stopping = first_step - 1, first_step - 1, False
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 600.0) -> None:
        """Stop producing and forget what was produced (its prompts are not drawn again)."""
        thread, self._thread = self._thread, None
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if thread is not None:
            self._stop_waits.set()  # a producer waiting for a missing service gives up at once
            thread.join(timeout_s)
            self._stop_waits.clear()
        self._batches.clear()
        self._errors.clear()

    def published(self, step: int) -> None:
        """Step `step`'s weights reached the generators."""
        with self._changed:
            self._published = max(self._published, step)
            self._changed.notify_all()

    def take(self, step: int) -> RolloutBatch:
        """Step `step`'s batch (waiting for it), every group within the age bound. A step outside
        the started range (a lone step: tests, tools) restarts the pipeline at it."""
        if self._thread is None or not self._asked < step <= self._last:
            self.start(step, step)
        waited = time.perf_counter()
        with self._changed:
            self._asked = step
            self._changed.notify_all()
            while step not in self._batches and step not in self._errors:
                self._changed.wait(1.0)
            if step in self._errors:
                self._thread = None  # the producer stopped at the failed batch: the next take starts anew
                raise self._errors.pop(step)
            batch = self._batches.pop(step)
        batch.metrics["time_rollout_wait_s"] = time.perf_counter() - waited
        self._cursors = {step: batch.cursor_after}
        batch, self._ledger = self._fresh(batch)
        return batch

    def cursor_after(self, step: int) -> dict[str, int]:
        """The data cursor's state after step `step`'s prompts (the step last taken): what a
        checkpoint of that step resumes from."""
        return self._cursors[step]

    def samples_of(self, step: int) -> StepSamples:
        """The ledger record of step `step` (the step last taken): which samples it trains."""
        return self._ledger[step]

    # ------------------------------------------------------------------ producer side

    def _may_produce(self, step: int) -> bool:
        return step <= min(self._published + 1 + self.max_age, self._asked + self.max_age)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopping and self._next <= self._last and not self._may_produce(self._next):
                    self._changed.wait(1.0)
                if self._stopping or self._next > self._last:
                    return
                step = self._next
            try:
                batch = self._make(step, self._num_groups)
            except BaseException as exc:  # raised by the take() of this step
                with self._changed:
                    self._errors[step] = exc
                    self._next = self._last + 1  # nothing after a failed batch
                    self._changed.notify_all()
                return
            with self._changed:
                if self._stopping:
                    return
                self._batches[step] = batch
                self._next = step + 1
                self._changed.notify_all()

    def _make(self, step: int, num_groups: int) -> RolloutBatch:
        started = time.perf_counter()
        with self._produce_lock:
            rollouts, metrics = self._produce(step, num_groups)
            cursor = self._cursor_state()
        metrics = {**metrics, "time_rollout_s": time.perf_counter() - started}
        return RolloutBatch(step, rollouts, metrics, cursor)

    # ------------------------------------------------------------------ the age bound

    def _fresh(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[int, StepSamples]]:
        """Drop the groups older than the bound and sample their prompts again; record the ages
        and the step's ledger record."""
        version = self._trainer_version()
        ages = [version - min(e.weight_version for e in group) for group in batch.rollouts.groups]
        stale = [i for i, age in enumerate(ages) if age > self.max_age]
        rollouts = batch.rollouts
        if stale:
            self._log.warning("stale_groups_dropped", step=batch.step, groups=len(stale), max_age=self.max_age,
                              ages=sorted(set(ages)))
            with self._produce_lock:
                again = self._resample(batch.step, rollouts.select(stale))  # by the current weights
            rollouts = RolloutGroups.concat([rollouts.drop(stale, DropReason.STALE), again])
        kept_ages = [version - min(e.weight_version for e in group) for group in rollouts.groups]
        batch.metrics.update(trajectory_age_mean=sum(kept_ages) / len(kept_ages), trajectory_age_max=float(max(kept_ages)),
                             stale_groups_dropped=float(len(stale)))
        ledger = {batch.step: StepSamples(batch.step, version, rollouts.ids(), rollouts.dropped)}
        return RolloutBatch(batch.step, rollouts, batch.metrics, batch.cursor_after), ledger
