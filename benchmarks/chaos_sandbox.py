"""A small disk for benchmarks/chaos.py's DISK_FULL fault: a tmpfs of a few MB that only the run
sees, and a way to fill it (a full disk during whatever the run writes there: its checkpoints).

No root is needed: `unshare -rm` makes a user namespace (the caller mapped to root inside it)
with a mount namespace of its own, where a sleeping holder process mounts the tmpfs and keeps the
namespace alive. Every launch of the run enters it (`prefix`: nsenter), so a coordinator run
again after a kill sees the same disk; processes outside it see an empty directory. The nemesis
fills the disk through the holder's view of it (/proc/<holder>/root) and empties it again.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from pathlib import Path

FILLER = ".chaos-filler"


class DiskUnavailable(RuntimeError):
    """No user and mount namespace here (unshare -rm failed): the full-disk fault cannot run."""


class SmallDisk:
    def __init__(self, path: Path, size_mb: int):
        self.path, self.size_mb = path.resolve(), size_mb
        self._holder: subprocess.Popen | None = None

    def start(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        script = f'mount -t tmpfs -o size={self.size_mb}m tandem-chaos "$0" && echo ready && exec sleep 86400'
        try:
            self._holder = subprocess.Popen(["unshare", "-rm", "--propagation", "private", "sh", "-c", script,
                                             str(self.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
        except FileNotFoundError as exc:
            raise DiskUnavailable("disk_full needs util-linux's unshare and nsenter") from exc
        if self._holder.stdout.readline().strip() != "ready":
            error = self._holder.stderr.read().strip() if self._holder.wait(timeout=10) is not None else "?"
            raise DiskUnavailable(f"disk_full needs an unprivileged user and mount namespace (unshare -rm): {error}")

    @property
    def pid(self) -> int:
        return self._holder.pid

    def prefix(self, cwd: Path) -> list[str]:
        """What a command is run under to see the disk, in directory `cwd` (nsenter would move it
        to the holder's)."""
        return ["nsenter", "-t", str(self.pid), "-U", "-m", "--preserve-credentials", f"--wd={cwd.resolve()}", "--"]

    def view(self, relative: str = "") -> Path:
        """The disk's directory `relative` as this process reaches it (through the holder)."""
        return Path(f"/proc/{self.pid}/root") / self.path.relative_to("/") / relative

    def fill(self) -> int:
        """Fill the disk to the last byte; returns the bytes the filler took."""
        written, block = 0, b"\0" * (1 << 20)
        fd = os.open(self.view(FILLER), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                try:
                    written += os.write(fd, block)  # a partial write at the end, then ENOSPC
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(block) == 4096:
                        return written
                    block = b"\0" * 4096  # what is left of the last megabyte
        finally:
            os.close(fd)

    def free(self) -> None:
        try:
            os.unlink(self.view(FILLER))
        except FileNotFoundError:
            pass

    def copy_out(self, relative: str, to: Path) -> None:
        """A copy of the disk's directory `relative` at `to` (for the checker, before close)."""
        shutil.rmtree(to, ignore_errors=True)
        if self.view(relative).is_dir():
            shutil.copytree(self.view(relative), to, symlinks=True)

    def close(self) -> None:
        if self._holder is not None and self._holder.poll() is None:
            os.kill(self._holder.pid, signal.SIGKILL)
            self._holder.wait()


def disk_available(scratch: Path) -> str | None:
    """None if a SmallDisk can be made here (under `scratch`), else why not."""
    disk = SmallDisk(scratch / "probe-disk", 1)
    try:
        disk.start()
    except DiskUnavailable as exc:
        return str(exc)
    finally:
        disk.close()
    return None
