"""A CPU generator's intra-op threads while it receives and applies a streamed weight update.

In a streamed update (worker_extension.RECEIVE_APPLY) vLLM's reload, which on CPU packs every
linear layer anew for oneDNN, runs while the weight-sync group's receiving thread copies the next
buckets out of its socket, and, in a local run, while the trainer's sending thread does the same
on the same cores. At the generator's full thread count the reload's OpenMP team takes every
core, its idle worker spins in libgomp between the reload's many short parallel regions, and the
threads that move the bytes wait for a core. At Qwen2.5-0.5B's shape on 2 cores a steady-state
publish of a whole run spent about a CPU-second in libgomp (perf). With one thread fewer for the
reload (1 of 2) that was gone, and the publish took 1.85 s against 2.29 s (medians of 9, whole
runs alternated: benchmarks/results/2026-12-03-receive-threads.md).

So the reload runs on one thread fewer than the generator has (never under one), and the count
comes back when the update ends, failed or not. Left alone: GPU generators (the reload's work is
on the device) and generators whose OpenMP threads vLLM pinned to cores (cpu_threads_bind: a
smaller team and a larger one again may not keep their pinning).

vLLM's CPU worker replaces `torch.set_num_threads` with a no-op that only warns, once it has
set its threads up (vllm/v1/worker/cpu_worker.py), so the count is set through
`torch._C.set_num_threads`, the function `torch.set_num_threads` is.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

UNPINNED = "nobind"
"""VLLM_CPU_OMP_THREADS_BIND when vLLM leaves its OpenMP threads unpinned (generator_svc/config.py
sets it unless cpu_threads_bind names cores; vLLM's own default, "auto", pins)."""


def receive_threads(threads: int) -> int:
    """The reload's threads during a streamed update, for a generator of `threads`: one core left
    to the threads that move the bytes."""
    return max(1, threads - 1)


@contextlib.contextmanager
def threads_while_receiving(device: torch.device, environ: dict[str, str] | None = None) -> Iterator[int]:
    """Within the block, torch's intra-op threads are `receive_threads` of the current count on an
    unpinned CPU generator (unchanged otherwise); yields the count the block runs with."""
    environ = os.environ if environ is None else environ
    before = torch.get_num_threads()
    if device.type != "cpu" or environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != UNPINNED:
        yield before
        return
    torch._C.set_num_threads(receive_threads(before))
    try:
        yield torch.get_num_threads()
    finally:
        torch._C.set_num_threads(before)
