"""What the loop does with the generators around the trainer's work, by colocation
(tandem.colocation decides it once, from colocated.enabled and the trainer's device kind).

Dedicated generators on GPUs: nothing; the step is rollouts -> train -> publish. On CPU, in a
synchronous run, generators free their weights after the rollouts (sleep level 2: the host's
memory goes to the trainer's step) and the publish loads them anew; one that cannot free them
(an external generator started without policy.generation.free_weights_while_training) keeps them.
Colocated generators on GPUs share the device with the trainer, so they sleep while it works:

    rollouts -> sleep (level 1: weights to host memory, KV cache dropped)
             -> trainer: logprobs, train
             -> trainer exports (empties its CUDA cache, packs the buckets) -> wake weights
             -> generators load (CUDA IPC) -> wake KV cache -> next rollouts

A generator refuses Generate while anything of it sleeps, so a rollout can only follow a
publish. A generator that cannot be reached while being put to sleep or woken is reported
through `on_dead` (the registry drops it) and the others go on; any other refusal is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from tandem.colocation import Colocation
from tandem.rpc import RpcFailure

R = TypeVar("R")


class GeneratorPhases:
    """Sleep and wake of generators that share the trainer's memory, tracked by member id; a no-op otherwise."""

    def __init__(self, colocation: Colocation, log, on_dead: Callable[[object, Exception], None] | None = None):
        self.colocation = colocation
        self._log = log
        self._on_dead = on_dead
        self._asleep: dict[str, object] = {}  # member_id -> GeneratorHandle
        self._weights_asleep: list = []  # during a publish: the generators whose weights still sleep

    @property
    def asleep(self) -> list[str]:
        """Member ids of the generators put to sleep and not woken yet."""
        return sorted(self._asleep)

    def release(self, generators: Sequence) -> None:
        """After the rollouts: free the generators' memory for the trainer (see the module doc)."""
        colocation = self.colocation
        if not colocation.sleeps:
            return
        level = colocation.sleep_level
        for handle in generators:
            if handle.member_id in self._asleep:
                continue
            if self._call(handle, lambda h: h.client.sleep(level), raise_errors=colocation.sleep_required):
                self._asleep[handle.member_id] = handle
        self._log.info("generators_asleep", generators=self.asleep, level=level)

    def publish(self, publish: Callable[[], R]) -> R:
        """Run `publish` with the sleeping generators' weights awake, then wake their KV cache
        (whether or not the publish succeeded: a stale generator is kept out of rollouts by
        admission, not by sleeping). The weights are woken by `wake_weights`, which the CUDA IPC
        transport calls once the trainer has exported (and, first, emptied its CUDA cache:
        trainer_svc/cuda_ipc.py), so vLLM takes its weights' memory back after the trainer gave
        its cache up, not before; whatever is still asleep then is woken here."""
        sleeping, self._asleep = list(self._asleep.values()), {}
        if not self.colocation.sleep_required:  # CPU generators freed their weights: the load is the wake-up
            return publish()
        self._weights_asleep = list(sleeping)
        try:
            result = publish()
            self.wake_weights()  # a transport that did not call it (nothing loaded)
        except BaseException:
            self._wake(self._weights_asleep, "weights", raise_errors=False)  # the publish's own error is the one to see
            self._weights_asleep = []
            self._wake_kv_cache(sleeping, raise_errors=False)
            raise
        self._wake_kv_cache(sleeping, raise_errors=True)
        return result

    def wake_weights(self) -> None:
        """Wake the weights of the generators that sleep through the publish in progress (once)."""
        waking, self._weights_asleep = self._weights_asleep, []
        self._wake(waking, "weights", raise_errors=True)

    def _wake(self, handles: list, memory: str, raise_errors: bool) -> None:
        for handle in handles:
            self._call(handle, lambda h: h.client.wake_up([memory]), raise_errors=raise_errors)

    def _wake_kv_cache(self, handles: list, raise_errors: bool) -> None:
        for handle in handles:
            self._call(handle, lambda h: h.client.wake_up(["kv_cache"]), raise_errors=raise_errors)
        if handles:
            self._log.info("generators_awake", generators=sorted(h.member_id for h in handles))

    def _call(self, handle, fn: Callable, raise_errors: bool) -> bool:
        """Whether `fn(handle)` succeeded; an unreachable generator is reported through on_dead."""
        try:
            fn(handle)
            return True
        except RpcFailure as exc:
            self._log.warning("generator_sleep_wake_failed", member_id=handle.member_id, code=exc.status.name,
                              error=exc.details)
            if exc.status.unreachable:
                if self._on_dead is not None:
                    self._on_dead(handle, exc)
                return False
            if raise_errors:
                raise
            return False
