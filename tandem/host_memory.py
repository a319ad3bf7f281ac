"""Host memory: transparent huge pages for torch's CPU tensors, asked for in every service's
environment, and tcmalloc as the allocator of the services that hold tensors.

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

The allocator. glibc's malloc gives a freed block above its mmap threshold (128 KiB, rising
to at most 32 MiB) back to the kernel at once, so the same memory is faulted in again at the next
step or version; tcmalloc keeps freed memory for the process's next allocations. vLLM's
CPU backend asks for it in LD_PRELOAD (its worker warns when it is missing), and so does
PyTorch's CPU performance guide. Measured at Qwen2.5-0.5B's shape in fp32, one process each,
idle, interleaved glibc / tcmalloc (both with huge pages):
- vLLM-CPU's reload of a fresh weight version, one thread as a generator runs it: 7.4-8.6 s
  against 0.8-1.2 s (the first reload of a process 7-8 s either way);
- the trainer's GRPO train step (benchmarks/train_step_real_size.py --variants new): 20.6-25.8 s
  against 14.4-15.0 s, peak RSS 11.35 against 10.5 GiB;
- the weight-sync wire (benchmarks/publish_real_size.py --no-generator): 50-52% of a raw
  broadcast's bandwidth against 67%.
Memory tcmalloc keeps is memory the process holds, and a whole run needs it given back where
another service needs it next: with tcmalloc kept in the trainer, a synchronous run's publish
phase took 12.8-16.9 s instead of 4.0 s (the generator's reload faulting its memory in while the
trainer sat on the step's freed working set) and its peak grew by 1.5-2.3 GiB. So the trainer
hands its free memory back at the end of each train step, and a CPU generator after freeing its
weights for the training (`release_free_memory`): then a whole run's publish phase took 2.5 s and
its peak fell below glibc's (benchmarks/results/2026-12-02-tcmalloc.md).
The local launcher preloads tcmalloc into the services that hold tensors (trainer, critic,
generators) of a CPU run (cluster.gpus_per_node 0; GPU runs keep the system's malloc until it is
measured there) when the host has it (`find_tcmalloc`; Debian/Ubuntu: libtcmalloc-minimal4, which
scripts/setup.sh installs), unless the environment chose: an LD_PRELOAD that already names an
allocator, or TANDEM_MALLOC=system. Slurm jobs and the images keep the system's malloc for now.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

HUGE_PAGES_VAR = "THP_MEM_ALLOC_ENABLE"
ALLOCATOR_VAR = "TANDEM_MALLOC"
ALLOCATORS = ("tcmalloc", "system")
"""TANDEM_MALLOC's values: tcmalloc (the default, where the host has it) or the system's malloc."""
TCMALLOC = "libtcmalloc_minimal.so.4"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/lib", "/usr/lib")
_PRELOADED_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")
RELEASE_AT_LEAST_BYTES = 256 << 20
"""`release_free_memory` hands memory back only when tcmalloc keeps at least this much free."""


def huge_pages_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a service's environment needs for huge-page tensors: {} when `environ` already chooses."""
    return {} if HUGE_PAGES_VAR in environ else {HUGE_PAGES_VAR: "1"}


def find_tcmalloc(dirs: Iterable[str] = LIBRARY_DIRS) -> str | None:
    """The path of tcmalloc's library on this host, or None."""
    return next((str(Path(d) / TCMALLOC) for d in dirs if (Path(d) / TCMALLOC).is_file()), None)


def allocator_env(environ: Mapping[str, str], tcmalloc: str | None) -> dict[str, str]:
    """What a tensor-holding service's environment needs for tcmalloc: LD_PRELOAD with `tcmalloc`
    first, then what `environ` preloads; {} when `environ` chose (TANDEM_MALLOC=system, or an
    LD_PRELOAD that names an allocator) or the host has none (`tcmalloc` None).
    Raises ValueError on a TANDEM_MALLOC that is not one of ALLOCATORS."""
    choice = environ.get(ALLOCATOR_VAR, "tcmalloc")
    if choice not in ALLOCATORS:
        raise ValueError(f"{ALLOCATOR_VAR}={choice!r}: use one of {', '.join(ALLOCATORS)} (or leave it unset: tcmalloc "
                         "where the host has it)")
    preload = environ.get("LD_PRELOAD", "")
    if choice == "system" or tcmalloc is None or any(name in preload for name in _PRELOADED_ALLOCATORS):
        return {}
    return {"LD_PRELOAD": ":".join(p for p in (tcmalloc, preload) if p)}


@functools.cache
def _tcmalloc_calls() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr] | None:
    """tcmalloc's (GetNumericProperty, ReleaseFreeMemory) when it is this process's allocator, else None."""
    process = ctypes.CDLL(None)
    release = getattr(process, "MallocExtension_ReleaseFreeMemory", None)
    return None if release is None else (process.MallocExtension_GetNumericProperty, release)


def release_free_memory(at_least: int = RELEASE_AT_LEAST_BYTES) -> str:
    """Hand the memory this process freed but tcmalloc keeps back to the kernel, when tcmalloc is
    the allocator and keeps at least `at_least` bytes free (less is not worth faulting in again:
    handing back every step of the tiny-model job made its training 70% slower). glibc keeps
    nothing this large, and its `malloc_trim` made the next reload slower
    (benchmarks/results/2026-12-02-tcmalloc.md). Returns "tcmalloc" when it released, else ""."""
    calls = _tcmalloc_calls()
    if calls is None:
        return ""
    get_property, release = calls
    free = ctypes.c_size_t(0)
    get_property(b"tcmalloc.pageheap_free_bytes", ctypes.byref(free))
    if free.value < at_least:
        return ""
    release()
    return "tcmalloc"
