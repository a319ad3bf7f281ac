"""The namespaces benchmarks/chaos.py runs a `tandem run` in, for the faults that need the run's
world to be the nemesis's: a small disk (DISK_FULL) and a network of its own (PARTITION).

No root is needed: `unshare -r` makes a user namespace (the caller mapped to root inside it) and,
as asked, a mount namespace where a tmpfs of a few MB is mounted (`disk_mb`), and a network
namespace with its own loopback (`network`). A sleeping holder process keeps them alive; every
launch of the run enters them (`prefix`: nsenter), so a coordinator run again after a kill sees
the same disk and the same network; processes outside see an empty directory and their own
loopback. The nemesis fills the disk through the holder's view of it (/proc/<holder>/root) and
empties it again; it changes the network's packet filter from inside (`inside`: iptables as the
namespace's root, benchmarks/chaos_net.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from pathlib import Path

FILLER = ".chaos-filler"


class SandboxUnavailable(RuntimeError):
    """No user, mount or network namespace here (unshare -r failed), or a tool it needs is
    missing: the faults that need it (disk_full, partition) cannot run."""


DiskUnavailable = SandboxUnavailable


class Sandbox:
    def __init__(self, path: Path, disk_mb: int | None = None, *, network: bool = False):
        """path: where the disk is mounted (disk_mb), and the holder's scratch."""
        self.path, self.disk_mb, self.network = path.resolve(), disk_mb, network
        self._holder: subprocess.Popen | None = None

    def start(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        steps = []
        if self.network:
            steps.append("ip link set lo up")
        if self.disk_mb:
            steps.append(f'mount -t tmpfs -o size={self.disk_mb}m tandem-chaos "$0"')
        script = " && ".join([*steps, "echo ready", "exec sleep 86400"])
        flags = ["-r", *(["-m", "--propagation", "private"] if self.disk_mb else []), *(["-n"] if self.network else [])]
        try:
            self._holder = subprocess.Popen(["unshare", *flags, "sh", "-c", script, str(self.path)],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                            start_new_session=True, text=True)
        except FileNotFoundError as exc:
            raise SandboxUnavailable("the chaos sandbox needs util-linux's unshare and nsenter") from exc
        if self._holder.stdout.readline().strip() != "ready":
            error = self._holder.stderr.read().strip() if self._holder.wait(timeout=10) is not None else "?"
            raise SandboxUnavailable(f"no unprivileged user namespace with{' a mount' if self.disk_mb else ''}"
                                     f"{' a network' if self.network else ''} namespace here (unshare "
                                     f"{' '.join(flags)}): {error}")

    @property
    def pid(self) -> int:
        return self._holder.pid

    def _namespaces(self) -> list[str]:
        return ["-U", *(["-m"] if self.disk_mb else []), *(["-n"] if self.network else [])]

    def prefix(self, cwd: Path) -> list[str]:
        """What a command is run under to be in the sandbox, in directory `cwd` (nsenter would move
        it to the holder's)."""
        return ["nsenter", "-t", str(self.pid), *self._namespaces(), "--preserve-credentials",
                f"--wd={cwd.resolve()}", "--"]

    def inside(self, argv: list[str], stdin: str = "") -> None:
        """Run a command in the sandbox as its root (e.g. iptables in its network); RuntimeError
        with its output if it fails."""
        done = subprocess.run(["nsenter", "-t", str(self.pid), *self._namespaces(), "--", *argv], input=stdin,
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in the chaos sandbox failed: {done.stderr.strip() or done.stdout}")

    # --- the small disk (disk_mb) -------------------------------------------------------------

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
    """None if a Sandbox with a small disk can be made here (under `scratch`), else why not."""
    disk = Sandbox(scratch / "probe-disk", 1)
    try:
        disk.start()
    except SandboxUnavailable as exc:
        return str(exc)
    finally:
        disk.close()
    return None
