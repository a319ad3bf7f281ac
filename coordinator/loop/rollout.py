"""Rollouts: spread prompts x n samples over the live generators by free capacity, stream
the completions back, and re-send the prompts of a generator that fails mid-request.

A prompt's n samples always come from one generator call, so every group is sampled with
one weight version. Sample j of prompt p is seeded `seed + p * n + j` whichever generator
serves it (a share is sent as calls over contiguous prompt ranges), so a re-sent prompt is
sampled exactly as it would have been on the generator that died.

A generator fails in one of two ways: its call errors (a killed process resets the
connection: the stream raises at once), or its call hangs (a stopped or wedged process
keeps the connection open). The second is noticed through membership: while calls are in
flight, every `poll_s` each busy generator is checked with `present`, and one that is gone
(no heartbeat) is reported through `on_failure`, which closes its channel and so cancels
its streams; either way its prompts go to the generators still alive. A generator that is
leaving (draining after SIGTERM) is still present: its calls are left to finish, but it is
no longer among `generators()`, so it gets nothing new, re-sends included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace

from coordinator.membership.services import GeneratorHandle
from tandem.generation.types import Completion, SamplingConfig
from tandem.rpc import RpcFailure


def split_by_capacity(num_prompts: int, capacities: Sequence[int]) -> list[range]:
    """Contiguous prompt ranges, sized in proportion to each generator's capacity."""
    total = sum(max(c, 1) for c in capacities)
    bounds, start, acc = [], 0, 0
    for capacity in capacities:
        acc += max(capacity, 1)
        end = round(num_prompts * acc / total)
        bounds.append(range(start, end))
        start = end
    return bounds


def contiguous_runs(indices: Sequence[int]) -> list[list[int]]:
    """[0, 1, 2, 5, 6, 9] -> [[0, 1, 2], [5, 6], [9]]."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][-1] + 1 == index:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


class RolloutError(RuntimeError):
    """No live generator could finish the rollout."""


class GeneratorLost(ConnectionError):
    """A generator left the live members while it held prompts of this rollout."""


def generate(prompts: list[list[int]], sampling: SamplingConfig, generators: Callable[[], list[GeneratorHandle]],
             on_failure: Callable[[GeneratorHandle, Exception], None], log, *, max_rounds: int = 5,
             timeout_s: float = 600.0, poll_s: float = 0.5,
             present: Callable[[str], bool] | None = None) -> list[list[Completion]]:
    """Completions per prompt (n each, ordered by sample index).

    `generators()` returns the generators that may get work (asked again after a failure);
    `present(member_id)` says whether a generator holding calls is still there (default:
    whether it is among `generators()`), asked every poll_s; `on_failure` tells membership
    about a generator whose call failed or that is gone, and must close its client (that
    cancels its calls).
    """
    if present is None:
        def present(member_id: str) -> bool:
            return member_id in {g.member_id for g in generators()}
    results: dict[int, list[Completion]] = {}
    pending = list(range(len(prompts)))
    for _ in range(max_rounds):
        live = generators()
        if not live:
            raise RolloutError("no live generator")
        pending = _round(prompts, pending, live, sampling, present, on_failure, log, results, timeout_s, poll_s)
        if not pending:
            return [results[i] for i in range(len(prompts))]
        log.info("rollout_resend", prompts=len(pending))
    raise RolloutError(f"{len(pending)} prompts still unfinished after {max_rounds} rounds")


def _round(prompts, pending: list[int], live: list[GeneratorHandle], sampling: SamplingConfig, present,
           on_failure, log, results: dict[int, list[Completion]], timeout_s: float, poll_s: float) -> list[int]:
    """Send `pending` over `live` once; returns the prompts whose generator failed."""
    calls: list[tuple[GeneratorHandle, list[int]]] = []
    for handle, share in zip(live, split_by_capacity(len(pending), [g.capacity for g in live])):
        calls += [(handle, run) for run in contiguous_runs([pending[i] for i in share])]
    failed: list[int] = []
    lost: set[str] = set()

    def fail(handle: GeneratorHandle, exc: Exception, num_prompts: int) -> None:
        if handle.member_id not in lost:
            lost.add(handle.member_id)
            log.warning("generator_failed", member_id=handle.member_id, prompts=num_prompts,
                        error=exc.status.name if isinstance(exc, RpcFailure) else repr(exc),
                        detected_at=time.time())
            on_failure(handle, exc)

    pool = ThreadPoolExecutor(len(calls), thread_name_prefix="rollout")
    try:
        futures = {pool.submit(_run_share, h, prompts, run, sampling, timeout_s): (h, run) for h, run in calls}
        outstanding = set(futures)
        while outstanding:
            done, outstanding = wait(outstanding, timeout=poll_s, return_when=FIRST_COMPLETED)
            for future in done:
                handle, run = futures[future]
                exc = future.exception()
                if exc is None:  # complete groups are kept even if the generator died afterwards
                    results.update(future.result())
                    continue
                if isinstance(exc, RpcFailure) and exc.status.rejects_request:  # malformed everywhere: no re-send
                    raise exc
                if exc is not None and not isinstance(exc, RpcFailure | RolloutError):
                    raise exc
                fail(handle, exc or GeneratorLost(handle.member_id), len(run))
                failed.extend(run)
            if outstanding:
                busy = {futures[f][0].member_id for f in outstanding}
                gone = {member_id for member_id in busy if not present(member_id)}
                for future in [f for f in outstanding if futures[f][0].member_id in gone]:
                    handle, run = futures[future]
                    fail(handle, GeneratorLost(f"generator {handle.member_id} is gone (no heartbeat)"), len(run))
                    outstanding.discard(future)  # its thread ends once on_failure closed the channel
                    failed.extend(run)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return sorted(failed)


def _run_share(handle: GeneratorHandle, prompts: list[list[int]], indices: list[int], sampling: SamplingConfig,
               timeout_s: float) -> dict[int, list[Completion]]:
    """One call for a contiguous range of prompts; the generator seeds its prompt i with
    seed + i*n, so offsetting the seed by indices[0]*n keeps every sample's seed global."""
    share_sampling = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + indices[0] * sampling.n)
    by_prompt: dict[int, list[Completion]] = {i: [] for i in indices}
    for completion in handle.client.generate([prompts[i] for i in indices], share_sampling,
                                             request_id=f"{handle.member_id}", timeout_s=timeout_s):
        by_prompt[indices[completion.prompt_index]].append(completion)
    for index, completions in by_prompt.items():
        if len(completions) != sampling.n:
            raise RolloutError(f"generator {handle.member_id} returned {len(completions)} of {sampling.n} samples")
        completions.sort(key=lambda c: c.sample_index)
    return by_prompt
