"""Host memory (tandem/host_memory.py): huge pages for torch's CPU tensors (the variable every
launcher puts in a service's environment, and that it does what it is there for on this kernel),
and tcmalloc for the services that hold tensors (what the local launcher preloads, into which
services, and that a process started so runs on it and gives freed memory back when asked)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import structlog.testing

from coordinator.config import load_config
from coordinator.launch.local import LocalCluster, child_env, tensor_service_env
from coordinator.launch.specs import launch_all
from tandem.host_memory import ALLOCATOR_VAR, HUGE_PAGES_VAR, TCMALLOC, allocator_env, find_tcmalloc, huge_pages_env

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


LIB = "/lib/x/libtcmalloc_minimal.so.4"


def test_tensor_services_preload_tcmalloc_unless_the_environment_chose():
    assert allocator_env({}, LIB) == {"LD_PRELOAD": LIB}
    assert allocator_env({"LD_PRELOAD": "/a/libfoo.so"}, LIB) == {"LD_PRELOAD": f"{LIB}:/a/libfoo.so"}  # kept, after
    assert allocator_env({"LD_PRELOAD": "/a/libjemalloc.so.2"}, LIB) == {}  # an allocator of the user's: theirs wins
    assert allocator_env({ALLOCATOR_VAR: "system"}, LIB) == {}
    assert allocator_env({}, None) == {}  # none on this host: the system's malloc
    with pytest.raises(ValueError, match=r"TANDEM_MALLOC='jemalloc': use one of tcmalloc, system"):
        allocator_env({ALLOCATOR_VAR: "jemalloc"}, LIB)


def test_find_tcmalloc_looks_in_the_library_dirs(tmp_path):
    assert find_tcmalloc([str(tmp_path)]) is None
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / TCMALLOC).write_bytes(b"")
    assert find_tcmalloc([str(tmp_path / "a"), str(tmp_path / "b")]) == str(tmp_path / "b" / TCMALLOC)


class _Launcher:
    def __init__(self):
        self.env: dict[str, dict[str, str]] = {}

    def start(self, spec) -> None:
        self.env[spec.name] = spec.env


def test_the_launcher_gives_tcmalloc_to_the_services_that_hold_tensors_only(tmp_path):
    launcher = _Launcher()
    launch_all(load_config(), "model", tmp_path, "127.0.0.1:1", launcher, tensor_env={"LD_PRELOAD": LIB})
    assert sorted(launcher.env) == ["generator-0", "reward-arithmetic", "trainer"]
    assert launcher.env["trainer"]["LD_PRELOAD"] == launcher.env["generator-0"]["LD_PRELOAD"] == LIB
    assert "LD_PRELOAD" not in launcher.env["reward-arithmetic"]  # its sandboxes run users' programs


# Which allocator serves this process (from its memory map), and what release_free_memory does
# after 128 MiB were freed (under its 256 MiB gate: nothing) and after 512 MiB more (it hands
# them back): the resident set grown since the start, in MiB, after each.
ALLOCATOR_PROBE = """
import json, torch
from tandem.host_memory import release_free_memory
def grown(): return (int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20) - start
def churn(tensors):  # 64 MiB each (above glibc's largest mmap threshold), written, then freed
    x = [torch.ones(16 << 20) for _ in range(tensors)]
    del x
start = 0
start = grown()
churn(2)
small = release_free_memory(), grown()
churn(8)
kept = grown()
large = release_free_memory(), grown()
print(json.dumps({"tcmalloc": "libtcmalloc" in open("/proc/self/maps").read(), "small": small, "kept": kept,
                  "large": large}))
"""


def _probe(env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", ALLOCATOR_VAR)}
    out = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_service_started_with_the_launchers_environment_runs_on_tcmalloc():
    """scripts/setup.sh installs tcmalloc: this host has it. A warning is logged when a host does not."""
    env = tensor_service_env({}, structlog.get_logger())
    assert find_tcmalloc() is not None and env["LD_PRELOAD"] == find_tcmalloc(), "apt-get install libtcmalloc-minimal4"
    probe = _probe(env)
    assert probe["tcmalloc"]
    assert probe["small"][0] == "" and probe["small"][1] >= 96  # under the gate: kept for the next step
    assert probe["kept"] >= 384  # tcmalloc keeps what was freed ...
    assert probe["large"][0] == "tcmalloc" and probe["large"][1] < 64  # ... until handed back (the trainer, each step)
    system = _probe(tensor_service_env({ALLOCATOR_VAR: "system"}, structlog.get_logger()))
    assert not system["tcmalloc"]
    assert system["kept"] < 64 and system["large"][0] == ""  # glibc gives blocks this large back at once


def test_a_host_without_tcmalloc_is_told_what_to_install(monkeypatch):
    monkeypatch.setattr("coordinator.launch.local.find_tcmalloc", lambda: None)
    with structlog.testing.capture_logs() as logs:
        assert tensor_service_env({}, structlog.get_logger()) == {}
        assert tensor_service_env({ALLOCATOR_VAR: "system"}, structlog.get_logger()) == {}
    assert [e["event"] for e in logs] == ["tcmalloc_not_found"]  # once: the second chose the system's
    assert "apt-get install libtcmalloc-minimal4" in logs[0]["fix"]


def test_only_a_cpu_run_preloads_tcmalloc(tmp_path):
    """GPU runs keep the system's malloc: tcmalloc was measured on CPU runs only."""
    def tensor_env(*overrides: str) -> dict[str, str]:
        cfg = load_config(None, ["cluster.host=127.0.0.1", *overrides])
        return LocalCluster(cfg, "unused-model", tmp_path, "token", structlog.get_logger()).tensor_env

    assert tensor_env()["LD_PRELOAD"] == find_tcmalloc()
    assert tensor_env("cluster.gpus_per_node=1") == {}
    assert tensor_env("cluster.launch=external") == {}  # services someone else starts: their environment
