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
