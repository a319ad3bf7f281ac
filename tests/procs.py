"""Start real service processes for tests and stop them by pid (their own process group)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TOKEN = "test-token"


@dataclass
class ServiceProcess:
    process: subprocess.Popen
    address: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # anything left in its group
        except ProcessLookupError:
            pass
        return self.process.wait(timeout=10)


def start(argv: list[str], workdir: Path, name: str, *, env: dict[str, str] | None = None,
          timeout_s: float = 180.0) -> ServiceProcess:
    """Run argv (which must accept --address-file) and wait until it serves."""
    address_file = workdir / f"{name}.addr"
    log_path = workdir / f"{name}.log"
    full_env = {**os.environ, "TANDEM_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})}
    with open(log_path, "wb") as out:
        process = subprocess.Popen([*argv, "--address-file", str(address_file)], stdout=out, stderr=subprocess.STDOUT,
                                   env=full_env, start_new_session=True, stdin=subprocess.DEVNULL)
    service = ServiceProcess(process, "", log_path)
    deadline = time.monotonic() + timeout_s
    while not address_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"{name} did not start (rc={process.poll()}):\n{service.log()[-4000:]}")
        time.sleep(0.2)
    service.address = address_file.read_text().strip()
    return service


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def vllm_engine_forked(service: ServiceProcess) -> bool:
    """Whether a generator's vLLM engine process (its child titled VLLM::EngineCore) was forked from
    the service rather than spawned: a fork keeps the service's heap address, an exec'd process
    gets a new random one (address space layout randomisation, which must be on)."""
    import psutil

    assert Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0", "ASLR is off on this machine"
    children = psutil.Process(service.process.pid).children()
    engines = [c for c in children if "EngineCore" in " ".join(c.cmdline())]
    assert len(engines) == 1, [c.cmdline() for c in children]
    return _heap_start(engines[0].pid) == _heap_start(service.process.pid)


def _heap_start(pid: int) -> str:
    return next(line.split("-")[0] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                if line.endswith("[heap]"))


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (one that exited and waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_CLI = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('coordinator.cli.main', run_name='__main__', alter_sys=True)")


def tandem_cli(*args: str, cwd: Path, home: Path, **popen) -> subprocess.Popen:
    """`tandem ARGS` as a user runs it in `cwd` (TANDEM_HOME `home`, no token in the environment:
    the run makes its own), in a session of its own, output and errors together as text. SIGINT
    interrupts it as in a terminal (a background process would otherwise inherit it ignored)."""
    env = {**os.environ, "TANDEM_HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop("TANDEM_TOKEN", None)
    return subprocess.Popen([sys.executable, "-c", _CLI, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen)


def wait_until(proc: subprocess.Popen, condition, what: str, *, timeout_s: float, output) -> float:
    """Poll `condition()` every 0.5 s until it holds, failing the test (with the end of `output()`)
    if `proc` exits first or `timeout_s` passes; returns the seconds waited."""
    import pytest

    started = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            time.sleep(1)  # the last lines of its output
            pytest.fail(f"the run exited (rc {proc.returncode}) before {what}:\n{output()[-5000:]}")
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}:\n{output()[-3000:]}"
        time.sleep(0.5)
    return time.monotonic() - started


class Events:
    """A logger that records the names of the events logged to it (structlog's info/warning/debug)."""

    def __init__(self):
        self.names: list[str] = []

    def _add(self, event, **fields):
        self.names.append(event)

    info = warning = debug = _add
