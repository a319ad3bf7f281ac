"""Raw file I/O of the trainer's checkpoints with O_DIRECT, where the filesystem takes it.

`write_chunks` writes items back to back into one file and fsyncs it; `read_ranges` fills places
in memory from ranges of such a file. Both go through page-aligned stage buffers, so the kernel
fills no page cache: on a VM whose host takes back free memory (the 2-core machines these
benchmarks ran on), every page the cache takes costs as much to zero as a fresh page of the
trainer's, and a checkpoint's 5.5 GiB through the cache cost tens of CPU-seconds each way
(benchmarks/results/2026-12-02-direct-checkpoint-writes.md, 2026-12-02-direct-checkpoint-reads.md).
A filesystem that refuses O_DIRECT (EINVAL; tmpfs, for one) gets ordinary buffered I/O.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch


def bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy (contiguous CPU tensors)."""
    return memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())


@dataclass
class Chunk:
    """An item's bytes and where they start in the file."""
    offset: int
    data: torch.Tensor | bytes


DIRECT_BLOCK_BYTES = 4096
"""What O_DIRECT asks of each write's memory, file offset and length: a multiple of the device's
logical block (512 B or 4 KiB)."""
DIRECT_STAGE_BYTES = 16 << 20
"""The size of each aligned buffer direct I/O goes through (one for a write, two for a read)."""


def write_chunks(file: Path, chunks: list[Chunk], direct: bool = True) -> str:
    """Write `chunks` back to back into `file` and fsync it: with O_DIRECT where the filesystem
    takes it ("direct"), else (or with `direct` False) through the page cache ("buffered"; tmpfs,
    for one, refuses O_DIRECT).

    Direct, the bytes go from an aligned buffer to the disk without the kernel copying them into
    page-cache pages it must first find and zero. On the 2-core VM this was measured on, writing
    2.5 GiB through the page cache cost 17-25 CPU-seconds of the kernel (21-31 s) while the
    generator was rolling out the next step; with O_DIRECT 0.3 s (2.2 s), and the file holds
    the same bytes (benchmarks/results/2026-12-02-direct-checkpoint-writes.md)."""
    offset = 0
    for chunk in chunks:
        if chunk.offset != offset:
            raise ValueError(f"checkpoint chunks must lie back to back: one at {chunk.offset}, expected {offset}")
        offset += len(_view(chunk))
    if direct and hasattr(os, "O_DIRECT"):
        try:
            _write_direct(file, chunks)
            return "direct"
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this filesystem (or its alignment) does not take O_DIRECT
                raise
    with open(file, "wb", buffering=0) as out:
        for chunk in chunks:
            view = _view(chunk)
            written = 0
            while written < len(view):
                written += out.write(view[written:])
        os.fsync(out.fileno())
    return "buffered"


def _view(chunk: Chunk) -> memoryview:
    return memoryview(chunk.data) if isinstance(chunk.data, bytes) else bytes_of(chunk.data)


def _write_direct(file: Path, chunks: list[Chunk]) -> None:
    """The chunks' bytes through one page-aligned buffer (an anonymous mmap) in whole buffers;
    the last one padded to a block, and the file cut back to its length."""
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    stage = mmap.mmap(-1, DIRECT_STAGE_BYTES)
    buffer = memoryview(stage)
    try:
        filled = total = 0

        def flush(count: int) -> None:
            written = 0
            while written < count:
                written += os.write(fd, buffer[written:count])

        for chunk in chunks:
            data = _view(chunk)
            at = 0
            while at < len(data):
                take = min(len(data) - at, DIRECT_STAGE_BYTES - filled)
                buffer[filled:filled + take] = data[at:at + take]
                filled, at = filled + take, at + take
                if filled == DIRECT_STAGE_BYTES:
                    flush(filled)
                    total, filled = total + filled, 0
            del data
        if filled:
            padded = -(-filled // DIRECT_BLOCK_BYTES) * DIRECT_BLOCK_BYTES
            buffer[filled:padded] = bytes(padded - filled)
            flush(padded)
            os.ftruncate(fd, total + filled)
        os.fsync(fd)
    finally:
        buffer.release()
        stage.close()
        os.close(fd)


def read_ranges(file: Path, places: Iterable[tuple[int, memoryview]], direct: bool = True) -> str:
    """Fill each (offset, memory) of `places` from `file`, in the order given (offsets ascending;
    the next place is asked for once the last is filled); returns how ("direct" or "buffered").

    Direct (O_DIRECT where the filesystem takes it), the file is read in aligned windows of
    DIRECT_STAGE_BYTES into two buffers, the next window read while this one is copied out, so
    the kernel fills no page cache beside the tensors being loaded: a 0.5B trainer's 5.5 GiB came
    back in 8.1 s against 41 s through the cache on a VM whose host takes back free memory
    (benchmarks/results/2026-12-02-direct-checkpoint-reads.md)."""
    fd = _open_direct(file) if direct else None
    if fd is None:
        with open(file, "rb", buffering=0) as f:
            for offset, view in places:
                f.seek(offset)
                done = 0
                while done < len(view):
                    n = f.readinto(view[done:])
                    if not n:
                        raise _cut_short(file, offset + len(view))
                    done += n
        return "buffered"
    try:
        _read_direct(fd, file, places)
    finally:
        os.close(fd)
    return "direct"


def _read_direct(fd: int, file: Path, places: Iterable[tuple[int, memoryview]]) -> None:
    """Two aligned stage buffers: while one window's bytes are copied to their places, a thread
    reads the next window of the file into the other (the read waits on the disk, the copy on
    memory: they overlap)."""
    stages = [mmap.mmap(-1, DIRECT_STAGE_BYTES) for _ in range(2)]
    buffers = [memoryview(stage) for stage in stages]
    reader = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-read")
    window = (0, 0, 0)  # (buffer, start, bytes filled): buffers[0] holds the file's [start, start + filled)
    ahead: tuple[int, Future] | None = None  # (start, the read of the window after `window` into the other buffer)
    try:
        for offset, view in places:
            at = 0
            while at < len(view):
                position = offset + at
                current, start, filled = window
                if not start <= position < start + filled:
                    current, start = 1 - current, position - position % DIRECT_BLOCK_BYTES
                    if ahead is not None and ahead[0] == start:
                        filled = ahead[1].result()
                    else:
                        if ahead is not None:
                            ahead[1].result()  # its buffer is the one read into next
                        filled = os.preadv(fd, [buffers[current]], start)
                    ahead = None
                    if filled <= position - start:
                        raise _cut_short(file, offset + len(view))
                    if filled == DIRECT_STAGE_BYTES:
                        ahead = (start + filled, reader.submit(os.preadv, fd, [buffers[1 - current]], start + filled))
                    window = (current, start, filled)
                take = min(len(view) - at, start + filled - position)
                view[at:at + take] = buffers[current][position - start:position - start + take]
                at += take
    finally:
        if ahead is not None:
            wait([ahead[1]])  # not past the buffers' and the descriptor's lifetime
        reader.shutdown()
        for buffer in buffers:
            buffer.release()
        for stage in stages:
            stage.close()


def _cut_short(file: Path, end: int) -> ValueError:
    return ValueError(f"checkpoint file {file} ends before byte {end}: a partial write")


def _open_direct(file: Path) -> int | None:
    """A descriptor of `file` opened with O_DIRECT that has read its first block, or None where
    the filesystem refuses O_DIRECT (EINVAL at the open or at that read: tmpfs, for one)."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        fd = os.open(file, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    probe = mmap.mmap(-1, DIRECT_BLOCK_BYTES)
    try:
        os.preadv(fd, [probe], 0)
        return fd
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.EINVAL:
            return None
        raise
    finally:
        probe.close()
