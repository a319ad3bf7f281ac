"""A checkpoint file's write and read, direct (O_DIRECT through one aligned buffer) against
buffered (the page cache), interleaved, with the CPU each costs (this process's user and system
seconds, which include the kernel's copies through the page cache and its zeroing of the pages it
takes).

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_io.py --gib 5.5 --reps 3

The bytes: random tensors of 512 MiB standing for a 0.5B trainer's checkpoint (fp32 parameters
and Adam's two moments: 5.5 GiB), written by trainer_svc/backends/dtensor/direct_io.py's
`write_chunks` as a save writes them, into a scratch directory under --dir (default: the system's
temporary directory; give the checkpoints' disk), fsynced, then deleted (so the page cache the buffered write filled is freed
before the next write). Then one file, written once, is read back as a resume reads it
(`read_ranges`, each tensor's bytes into a tensor of its own, allocated for that read as a fresh
trainer's are), its pages evicted from the cache before each read (posix_fadvise DONTNEED), and
the bytes checked. Prints the figures; nothing is written under benchmarks/results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainer_svc.backends.dtensor.direct_io import Chunk, bytes_of, read_ranges, write_chunks

MiB, GiB = 1 << 20, 1 << 30


def timed_write(path: Path, chunks: list[Chunk], direct: bool) -> tuple[float, float, str]:
    before, started = os.times(), time.perf_counter()
    how = write_chunks(path, chunks, direct=direct)
    wall, after = time.perf_counter() - started, os.times()
    path.unlink()
    cpu = (after.user - before.user) + (after.system - before.system)
    return wall, cpu, how


def timed_read(path: Path, chunks: list[Chunk], direct: bool) -> tuple[float, float, str]:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold: the bytes come from the disk
    os.close(fd)
    before, started = os.times(), time.perf_counter()
    into = [torch.empty_like(chunk.data) for chunk in chunks]
    how = read_ranges(path, ((chunk.offset, bytes_of(target)) for chunk, target in zip(chunks, into)), direct=direct)
    wall, after = time.perf_counter() - started, os.times()
    assert all(torch.equal(chunk.data, target) for chunk, target in zip(chunks, into)), "the bytes read differ"
    cpu = (after.user - before.user) + (after.system - before.system)
    return wall, cpu, how


def _report(what: str, total: float, count: int, reps: int, figures: dict[str, list[tuple[float, float]]]) -> None:
    print(f"\n{total / GiB:.2f} GiB in {count} items, {what}, median (min-max) of {reps}:")
    for variant, runs in figures.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"  {variant}: {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
              f"{statistics.median(cpus):.2f} CPU-s ({min(cpus):.2f}-{max(cpus):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=5.5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    count = max(1, round(args.gib * GiB / (512 * MiB)))
    tensors = [torch.rand(128 * MiB) for _ in range(count)]  # 512 MiB of fp32 each
    chunks, offset = [], 0
    for tensor in tensors:
        chunks.append(Chunk(offset, tensor))
        offset += tensor.numel() * tensor.element_size()
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-writes-", dir=args.dir))
    figures: dict[str, list[tuple[float, float]]] = {"buffered": [], "direct": []}
    reads: dict[str, list[tuple[float, float]]] = {"buffered": [], "direct": []}
    try:
        for rep in range(args.reps):
            for variant in ("buffered", "direct") if rep % 2 == 0 else ("direct", "buffered"):
                wall, cpu, how = timed_write(scratch / f"{variant}.distcp", chunks, variant == "direct")
                assert how == variant, f"asked for a {variant} write, got {how}"
                figures[variant].append((wall, cpu))
                print(f"rep {rep + 1} write {variant}: {wall:.2f} s, {cpu:.2f} CPU-s "
                      f"({offset / GiB / wall:.2f} GiB/s)", flush=True)
        write_chunks(scratch / "ckpt.distcp", chunks)
        for rep in range(args.reps):
            for variant in ("buffered", "direct") if rep % 2 == 0 else ("direct", "buffered"):
                wall, cpu, how = timed_read(scratch / "ckpt.distcp", chunks, variant == "direct")
                assert how == variant, f"asked for a {variant} read, got {how}"
                reads[variant].append((wall, cpu))
                print(f"rep {rep + 1} read {variant}: {wall:.2f} s, {cpu:.2f} CPU-s "
                      f"({offset / GiB / wall:.2f} GiB/s)", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _report("write + fsync", offset, count, args.reps, figures)
    _report("cold read into fresh tensors", offset, count, args.reps, reads)


if __name__ == "__main__":
    main()
