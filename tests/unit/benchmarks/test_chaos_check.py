"""benchmarks/chaos_check.py's `stop_everything` on real processes: a "service" found by the run's
TANDEM_HOME goes with the processes it started, also one in a session of its own whose
environment does not name the run (as torchrun's ranks run in sessions of their own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from benchmarks.chaos_check import stop_everything
from tests import procs

SERVICE = r"""
import os, subprocess, sys, time
env = {k: v for k, v in os.environ.items() if k != "TANDEM_HOME"}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)
print(child.pid, flush=True)
time.sleep(300)
"""


def test_stop_everything_kills_each_service_with_what_it_started(tmp_path):
    home = tmp_path / "home"
    service = subprocess.Popen([sys.executable, "-c", SERVICE], env={**os.environ, "TANDEM_HOME": str(home)},
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(service.stdout.readline())
    try:
        assert stop_everything(home) == [service.pid]  # the child's environment does not name the run
        service.wait(timeout=10)
        deadline = time.monotonic() + 10
        while procs.alive(child) and time.monotonic() < deadline:  # reaped by init once killed
            time.sleep(0.05)
        assert not procs.alive(child), "the service's child outlived stop_everything"
    finally:
        for pid in (child, service.pid):
            if procs.alive(pid):
                os.kill(pid, signal.SIGKILL)
