"""Service side of the sandbox: start the launcher for one program, collect its bounded
output and reports, and make sure nothing outlives the run.

`run_program` is synchronous and blocking; the reward engine calls it from its worker
processes. It never raises because of what the program does: a program that crashes, loops or
floods its output comes back as a `SandboxResult`. Only a sandbox that cannot be built at
all (not root, no namespaces) shows up, as `SandboxResult.setup_error`.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from reward_svc.config import SandboxLimits
from reward_svc.sandbox.seccomp import build_filter

LAUNCHER = Path(__file__).with_name("launcher.py")
UID_BASE = 2_000_000_000
"""Each run executes as uid UID_BASE + the launcher's pid: a uid no file and no other live
run has, so RLIMIT_NPROC counts exactly that run's processes."""
REPORTS_BYTES = 64 << 10
"""What a program may report on fd 4 (the rest is dropped)."""
_KILL_MARGIN_S = 1.0  # past the wall clock, the launcher itself is killed (then the kernel kills the rest)


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed run ended and what it printed.

    exit_code: the program's exit status, or minus the signal that killed it (-9 when the
    wall clock ran out); None when the sandbox could not be built.
    """

    exit_code: int | None
    timed_out: bool
    output: str
    output_truncated: bool
    reports: bytes
    setup_error: str
    cpu_s: float
    wall_s: float
    uid: int
    """The uid the program ran as (UID_BASE + the launcher's pid): the host's processes of that
    uid are this run's, and none may outlive it."""


def _readonly_paths() -> list[str]:
    """What the program may read: the OS's binaries and libraries and the interpreter's own
    prefix (bound at the same path, since the interpreter finds its libraries by it)."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc/ld.so.cache", "/etc/localtime"]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    return [p for p in paths if os.path.lexists(p)]


def interpreter() -> str:
    """The base interpreter (never the venv's: its site-packages are not for the program)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def run_program(program: str, limits: SandboxLimits, *, input_text: str = "") -> SandboxResult:
    """Run `program` (Python source) in a fresh sandbox and wait for it.

    The program runs as `python -I -S -B /main.py` in /tmp (its private tmpfs) with an empty
    environment. fd 0 is /dev/null, fds 1 and 2 are captured together (first
    `limits.output_bytes` kept), fd 3 yields `input_text` then EOF, and whatever it writes to
    fd 4 comes back as `reports` (first 64 KiB kept).
    """
    started = time.monotonic()
    deadline = started + limits.wall_s + _KILL_MARGIN_S
    root_dir = tempfile.mkdtemp(prefix="tandem-sandbox-")  # the mount point of the sandbox's root
    out_r, out_w = os.pipe()
    rep_r, rep_w = os.pipe()
    job = {"root_dir": root_dir, "python": interpreter(), "readonly_paths": _readonly_paths(), "program": program,
           "input": input_text, "uid_base": UID_BASE, "output_fd": out_w, "results_fd": rep_w,
           "seccomp_hex": build_filter().hex(), "limits": limits.model_dump()}
    launcher = None
    try:
        launcher = subprocess.Popen([interpreter(), "-I", "-S", "-B", str(LAUNCHER)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(out_w, rep_w),
                                    env={}, start_new_session=True)
        os.close(out_w)  # only the sandbox holds the write ends now: EOF comes when its last process dies
        os.close(rep_w)
        out_w = rep_w = -1
        try:
            launcher.stdin.write(json.dumps(job).encode())
            launcher.stdin.close()
        except BrokenPipeError:
            pass
        status_r, stderr_r = launcher.stdout.fileno(), launcher.stderr.fileno()
        got = _collect({out_r: limits.output_bytes, rep_r: REPORTS_BYTES, status_r: 4096, stderr_r: 8192}, deadline)
    finally:
        if launcher is not None:
            _kill_group(launcher.pid)
            launcher.wait()
            launcher.stdout.close()
            launcher.stderr.close()
        for fd in (out_r, rep_r, out_w, rep_w):
            if fd >= 0:
                os.close(fd)
        _remove_root(root_dir)
    late = time.monotonic() >= deadline
    status = _launcher_status(got[status_r][0], got[stderr_r][0], launcher.returncode, late)
    output, truncated = got[out_r]
    return SandboxResult(exit_code=status["exit_code"], timed_out=status["timed_out"],
                         output=output.decode(errors="replace"), output_truncated=truncated, reports=got[rep_r][0],
                         setup_error=status["setup_error"], cpu_s=status["cpu_s"], wall_s=time.monotonic() - started,
                         uid=UID_BASE + launcher.pid)


def _launcher_status(status_line: bytes, stderr: bytes, returncode: int, late: bool) -> dict:
    """The launcher's JSON report, or what its absence means: killed at the deadline (a
    timeout) or crashed before it (a sandbox that could not be built)."""
    try:
        status = json.loads(status_line)
    except ValueError:
        if late:
            return {"exit_code": -signal.SIGKILL, "timed_out": True, "cpu_s": 0.0, "setup_error": ""}
        error = f"launcher failed (rc={returncode}): {stderr.decode(errors='replace')[-2000:]}"
        return {"exit_code": None, "timed_out": False, "cpu_s": 0.0, "setup_error": error}
    if status["setup_error"]:
        status["exit_code"] = None
    return status


def _collect(caps: dict[int, int], deadline: float) -> dict[int, tuple[bytes, bool]]:
    """Read every fd to EOF (or until the deadline), keeping at most caps[fd] bytes of each."""
    data = {fd: bytearray() for fd in caps}
    truncated = dict.fromkeys(caps, False)
    with selectors.DefaultSelector() as selector:
        for fd in caps:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                room = caps[key.fd] - len(data[key.fd])
                data[key.fd] += chunk[:max(room, 0)]
                truncated[key.fd] |= len(chunk) > room
    return {fd: (bytes(data[fd]), truncated[fd]) for fd in caps}


def _kill_group(pid: int) -> None:
    """The launcher's session: normally already gone; past the deadline, its death takes the
    sandbox's pid namespace with it (parent-death signal of the namespace's init)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_root(root_dir: str) -> None:
    """The mount point is empty on the host side: the tmpfs lived only in the sandbox's mount
    namespace. rmdir (not rmtree) so that a mistake can never delete anything else."""
    try:
        os.rmdir(root_dir)
    except OSError:
        pass
