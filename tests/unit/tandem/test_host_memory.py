"""Huge pages for torch's CPU tensors (tandem/host_memory.py): the variable every launcher puts in
a service's environment, and that it does what it is there for on this kernel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from coordinator.launch.local import child_env
from tandem.host_memory import HUGE_PAGES_VAR, huge_pages_env

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# Allocates and writes a 64 MiB tensor, prints the process's anonymous huge-page kB.
PROBE = """
import re, torch
x = torch.empty(64 << 20, dtype=torch.uint8); x.fill_(1)
print(re.search(r"AnonHugePages:\\s+(\\d+) kB", open("/proc/self/smaps_rollup").read()).group(1))
"""


def test_services_ask_for_huge_pages_unless_the_environment_chose():
    assert huge_pages_env({}) == {HUGE_PAGES_VAR: "1"}
    assert huge_pages_env({HUGE_PAGES_VAR: "0"}) == {}  # the user's choice passes through untouched
    assert child_env("t", {})[HUGE_PAGES_VAR] == "1"  # what a locally launched service starts with
    assert HUGE_PAGES_VAR not in child_env("t", {HUGE_PAGES_VAR: "0"})  # the launcher passes os.environ's on


def _huge_kib(value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES_VAR}
    if value is not None:
        env[HUGE_PAGES_VAR] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_the_variable_gives_a_tensor_huge_pages_where_the_kernel_lends_them():
    mode = re.search(r"\[(\w+)\]", THP_MODE.read_text()).group(1) if THP_MODE.exists() else "never"
    asked, not_asked = _huge_kib("1"), _huge_kib(None)
    # madvise (Linux's default): huge pages only for memory that asks, which the variable makes torch do
    assert (asked >= 32 << 10) == (mode != "never"), (mode, asked)
    assert (not_asked >= 32 << 10) == (mode == "always"), (mode, not_asked)
