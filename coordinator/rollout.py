"""Rollouts: spread prompts x n samples over the live generators by free capacity, stream
the completions back, and re-send the prompts of a generator that fails mid-request.

A prompt's n samples always come from one generator call, so every group is sampled with
one weight version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace

import grpc

from generator_svc.types import Completion, SamplingConfig


@dataclass(frozen=True)
class GeneratorHandle:
    """A live generator as the rollout sees it."""

    member_id: str
    client: object  # generator_svc.client.GeneratorClient (or an in-process twin)
    capacity: int


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


class RolloutError(RuntimeError):
    """No live generator could finish the rollout."""


def generate(prompts: list[list[int]], sampling: SamplingConfig, generators: Callable[[], list[GeneratorHandle]],
             on_failure: Callable[[GeneratorHandle, Exception], None], log, *, max_rounds: int = 5,
             timeout_s: float = 600.0) -> list[list[Completion]]:
    """Completions per prompt (n each, ordered by sample index).

    `generators()` returns the live generators (it is asked again after a failure);
    `on_failure` tells membership about a generator whose call failed.
    """
    results: dict[int, list[Completion]] = {}
    pending = list(range(len(prompts)))
    for _ in range(max_rounds):
        live = generators()
        if not live:
            raise RolloutError("no live generator")
        shares = split_by_capacity(len(pending), [g.capacity for g in live])
        with ThreadPoolExecutor(len(live)) as pool:
            futures = {}
            for handle, share in zip(live, shares):
                indices = [pending[i] for i in share]
                if indices:
                    futures[pool.submit(_run_share, handle, prompts, indices, sampling, timeout_s)] = (handle, indices)
            failed: list[int] = []
            for future in as_completed(futures):
                handle, indices = futures[future]
                try:
                    results.update(future.result())
                except grpc.RpcError as exc:
                    log.warning("generator_failed", member_id=handle.member_id, prompts=len(indices),
                                code=exc.code().name if hasattr(exc, "code") else "?")
                    on_failure(handle, exc)
                    failed.extend(indices)
        pending = sorted(failed)
        if not pending:
            return [results[i] for i in range(len(prompts))]
        log.info("rollout_resend", prompts=len(pending))
    raise RolloutError(f"{len(pending)} prompts still unfinished after {max_rounds} rounds")


def _run_share(handle: GeneratorHandle, prompts: list[list[int]], indices: list[int], sampling: SamplingConfig,
               timeout_s: float) -> dict[int, list[Completion]]:
    # Distinct seeds per prompt across shares: the generator seeds prompt i with seed + i*n.
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
