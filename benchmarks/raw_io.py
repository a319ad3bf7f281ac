"""What the machine itself does with N bytes, for benchmarks/real_size.py to set Tandem's
figures against, measured in the same invocation:

- `broadcast_seconds`: a raw torch.distributed gloo broadcast of one N-byte tensor from one
  process to another over loopback (no bucketing, no RPCs, no copies into or out of a model):
  barrier, broadcast, barrier, timed on the sender; run in fresh processes
  (`python benchmarks/raw_io.py broadcast N [--repeats R]` prints the seconds as a JSON list);
- `disk_seconds`: write N bytes into a file beside the checkpoints (64 MiB chunks, then fsync),
  drop the file's pages from the page cache (posix_fadvise DONTNEED), read it back;
- `evict`: drop a directory's files from the page cache, so a checkpoint load that follows
  reads the disk as `disk_seconds`' read did.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 64 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broadcast_rank(rank: int, port: int, num_bytes: int, repeats: int, out) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensor = torch.ones(num_bytes, dtype=torch.uint8) if rank == 0 else torch.zeros(num_bytes, dtype=torch.uint8)
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.broadcast(tensor, src=0)
        dist.barrier()
        seconds.append(time.perf_counter() - started)
    if rank == 1 and int(tensor[-1]) != 1:
        raise AssertionError("the broadcast did not arrive")
    dist.destroy_process_group()
    if out is not None:
        out.put(seconds)


def broadcast_in_process(num_bytes: int, repeats: int) -> list[float]:
    """This process as the sender, a spawned one as the receiver: seconds of each repeat."""
    import multiprocessing as mp

    port = _free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    receiver = ctx.Process(target=_broadcast_rank, args=(1, port, num_bytes, repeats, None))
    receiver.start()
    try:
        _broadcast_rank(0, port, num_bytes, repeats, out)
        return out.get(timeout=60)
    finally:
        receiver.join(timeout=120)


def broadcast_seconds(num_bytes: int, repeats: int = 3, timeout_s: float = 1800) -> list[float]:
    """A raw gloo broadcast of `num_bytes` between two fresh processes, `repeats` times."""
    done = subprocess.run([sys.executable, __file__, "broadcast", str(num_bytes), "--repeats", str(repeats)],
                          check=True, capture_output=True, text=True, timeout=timeout_s)
    return json.loads(done.stdout.strip().splitlines()[-1])


def evict(path: Path) -> None:
    """Drop the page-cache pages of every file under `path` (clean pages only: sync first)."""
    os.sync()
    files = [Path(path)] if Path(path).is_file() else [f for f in Path(path).rglob("*") if f.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_seconds(directory: Path, num_bytes: int) -> tuple[float, float]:
    """(write + fsync, cold read) seconds of `num_bytes` in a file under `directory`, removed after."""
    path = Path(directory) / f".raw-io-{os.getpid()}"
    block = os.urandom(CHUNK)
    try:
        started = time.perf_counter()
        with open(path, "wb", buffering=0) as out:
            left = num_bytes
            while left > 0:
                left -= out.write(memoryview(block)[:min(left, CHUNK)])
            os.fsync(out.fileno())
        write_s = time.perf_counter() - started
        evict(path)
        buffer = bytearray(CHUNK)
        started = time.perf_counter()
        with open(path, "rb", buffering=0) as src:
            while src.readinto(buffer):
                pass
        return write_s, time.perf_counter() - started
    finally:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cast = sub.add_parser("broadcast")
    cast.add_argument("num_bytes", type=int)
    cast.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(broadcast_in_process(args.num_bytes, args.repeats)))


if __name__ == "__main__":
    main()
