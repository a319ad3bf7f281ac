"""Transparent huge pages for torch's CPU tensors, asked for in every service's environment.

A tensor's fresh memory is faulted in by the kernel page by page as it is first written. With
4 KiB pages that is 256 faults a MiB, and on a virtual machine a fault is expensive: on the
2-core machine this was measured on, allocating and filling 20 fresh 64 MiB tensors took
0.38-0.47 s idle (1.2 us a fault) and 7-8 s under load; with huge pages (2 MiB, 30x fewer
faults) 0.07 s idle and 0.8-2.3 s under load. Tandem allocates such memory all the time: a
generator stages every weight version it receives, vLLM-CPU materializes and re-packs every
layer at each update, and a trainer's gradients, activations and logits are made anew at every
step. Measured at Qwen2.5-0.5B's shape in fp32, idle, interleaved, without and with:
- the trainer's GRPO train step (benchmarks/train_step_real_size.py): 17.9-22.3 s against
  15.2-17.3 s, the same losses;
- vLLM-CPU's reload of a weight version: 2.2-3.7 s against 1.4-2.7 s; again with
  benchmarks/vllm_reload.py (2 runs x 4 reloads each, nothing else running): 3.5-9.6 s (median 6.2) against
  3.8-5.7 s (median 4.6), generation 2.4 against 2.1 s, the same greedy tokens;
- the weight-sync wire (benchmarks/publish_real_size.py --no-generator): 1.17-1.48 s, 31-41% of
  a raw broadcast's bandwidth, against 0.87-0.93 s, 49-57%.

torch's CPU allocator asks for huge pages (madvise(MADV_HUGEPAGE)) for allocations of 2 MiB or
more when THP_MEM_ALLOC_ENABLE=1 is set when the process first allocates (c10 reads it once), and
Linux's default mode, `madvise`, gives huge pages to exactly such memory. So the variable has to
be in the environment a service process starts with; the launchers put it there (local:
coordinator/launch/local.py, Slurm: coordinator/launch/slurm.py, the images: docker/), unless
the environment already sets it, which then wins (THP_MEM_ALLOC_ENABLE=0 turns it off).
"""

from __future__ import annotations

from collections.abc import Mapping

HUGE_PAGES_VAR = "THP_MEM_ALLOC_ENABLE"


def huge_pages_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a service's environment needs for huge-page tensors: {} when `environ` already chooses."""
    return {} if HUGE_PAGES_VAR in environ else {HUGE_PAGES_VAR: "1"}
