"""Hostile programs through the code environment: each must score 0 and leave no trace.

Every program starts with `ok = False` and sets `ok = True` only if its attack worked; the
item's only test is `assert ok`, so a sandbox that failed would score it 1. Attacks that
cannot tell from inside whether they worked (a write to the host's /tmp lands in the private
/tmp; kill -9 -1) leave evidence the test checks instead: a marker file, a connection on a
listener opened here, a victim process that must still be alive. The probes that are safe to
run unsandboxed are also run that way (test_probe_detects_an_escape_without_the_sandbox), to
show each can fail.

All programs run concurrently (small limits) so the suite takes seconds.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import reward_svc
from reward_svc.config import SandboxLimits
from reward_svc.envs import code
from reward_svc.sandbox import runner

LIMITS = SandboxLimits(cpu_s=1, wall_s=2.0, memory_bytes=256 << 20, max_processes=16)
ONLY_TEST = json.dumps({"tests": ["assert ok"]})
REWARD_DIR = str(Path(reward_svc.__file__).parent)
CONFIG_PY = str(Path(reward_svc.__file__).parent / "config.py")
SYSCALLS = {"x86_64": {"unshare": 272, "io_uring_setup": 425}, "aarch64": {"unshare": 97, "io_uring_setup": 425}}


class World:
    """What a program that escaped could reach: secrets, a writable host dir, listeners,
    victim processes (root with the secret in its environment, and nobody)."""

    def __init__(self, tmp: Path):
        self.tag = f"tandem-hostile-{secrets.token_hex(6)}"
        self.secret = secrets.token_hex(16)
        self.secret_file = tmp / "public" / "secret.txt"
        self.secret_file.parent.mkdir(mode=0o755)
        self.secret_file.write_text(self.secret)
        self.secret_file.chmod(0o644)
        self.token_file = tmp / "token"
        self.token_file.write_text(self.secret)
        self.token_file.chmod(0o600)
        self.drop_dir = tmp / "drop"
        self.drop_dir.mkdir()
        self.drop_dir.chmod(0o777)
        self.host_markers = [Path(f"/dev/shm/{self.tag}"), Path(f"/tmp/{self.tag}"), self.drop_dir / "escaped"]
        self._sockets: dict[str, socket.socket] = {}
        sleeper = ["/bin/sleep", "120"]
        self.victims = [subprocess.Popen(sleeper, env={"TANDEM_TOKEN": self.secret}),
                        subprocess.Popen(sleeper, user=65534, group=65534, env={})]
        self.hostname = socket.gethostname()

    def listener(self, name: str, family: int, kind: int, address) -> socket.socket:
        if name not in self._sockets:
            sock = socket.socket(family, kind)
            sock.bind(address)
            if kind == socket.SOCK_STREAM:
                sock.listen(16)
            self._sockets[name] = sock
        return self._sockets[name]

    def tcp(self, name: str) -> int:
        return self.listener(name, socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)).getsockname()[1]

    def udp(self, name: str) -> int:
        return self.listener(name, socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)).getsockname()[1]

    def unix(self, name: str) -> str:
        path = str(self.drop_dir / f"{name}.sock")
        self.listener(name, socket.AF_UNIX, socket.SOCK_STREAM, path)
        os.chmod(path, 0o777)
        return path

    def abstract(self, name: str) -> str:
        address = f"\0{self.tag}-{name}"
        self.listener(name, socket.AF_UNIX, socket.SOCK_STREAM, address)
        return address

    def reached(self, name: str) -> bool:
        """Did anything connect to (or send a datagram to) listener `name`?"""
        return bool(select.select([self._sockets[name]], [], [], 0)[0])

    def problems(self) -> list[str]:
        """Evidence any program left on the host (shared by every case)."""
        found = [f"marker {m} exists" for m in self.host_markers if m.exists()]
        found += [f"listener {n} was reached" for n in self._sockets if self.reached(n)]
        found += [f"victim {v.pid} died" for v in self.victims if v.poll() is not None]
        if socket.gethostname() != self.hostname:
            found.append("host name changed")
        return found

    def close(self) -> None:
        for victim in self.victims:
            victim.kill()
            victim.wait()
        for sock in self._sockets.values():
            sock.close()
        for marker in self.host_markers:
            marker.unlink(missing_ok=True)


def _libc_call(expr: str) -> str:
    return (f"import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"nr = {SYSCALLS}[platform.machine()]\nok = {expr}")


# name -> program (given the world). Programs may raise: an exception just leaves ok False.
CASES: dict[str, Callable[[World], str]] = {
    # files: reading and writing outside the working directory
    "read_world_readable_file": lambda w: f"ok = open({str(w.secret_file)!r}).read() == {w.secret!r}",
    "read_root_only_token_file": lambda w: f"ok = open({str(w.token_file)!r}).read() == {w.secret!r}",
    "read_service_source": lambda w: f"ok = 'class RewardSettings' in open({CONFIG_PY!r}).read()",
    "list_service_package": lambda w: f"import os\nok = 'engine.py' in os.listdir({REWARD_DIR!r})",
    "read_etc_shadow": lambda w: "ok = 'root:' in open('/etc/shadow').read()",
    "symlink_to_host_root": lambda w: (
        f"import os\nos.symlink('/', 'r')\nok = open('r{w.secret_file}').read() == {w.secret!r}"),
    "proc_root_of_host_process": lambda w: (
        f"ok = open('/proc/{w.victims[0].pid}/root{w.secret_file}').read() == {w.secret!r}"),
    "write_outside_workdir": lambda w: f"open({str(w.drop_dir / 'escaped')!r}, 'w').write('x')\nok = True",
    "write_dev_shm": lambda w: f"open('/dev/shm/{w.tag}', 'w').write('x')\nok = True",
    "write_host_tmp": lambda w: f"open('/tmp/{w.tag}', 'w').write('x')",  # lands in the private /tmp
    "read_sys": lambda w: "import os\nok = os.path.exists('/sys/kernel') or os.path.exists('/sys/fs/cgroup')",
    "write_proc_sysrq": lambda w: "open('/proc/sysrq-trigger', 'w').write('h')\nok = True",
    # the service's secrets and environment
    "environment_variable": lambda w: f"import os\nok = {w.secret!r} in repr(os.environ)",
    "proc_environ_scan": lambda w: (
        "import os\nfor pid in os.listdir('/proc'):\n    try:\n"
        f"        ok = ok or {w.secret!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read()\n"
        "    except OSError:\n        pass"),
    "environ_by_host_pid": lambda w: (
        f"ok = {w.secret!r}.encode() in open('/proc/{w.victims[0].pid}/environ', 'rb').read()"),
    "subprocess_cat_secret": lambda w: (
        f"import subprocess\nr = subprocess.run(['/bin/cat', {str(w.secret_file)!r}], capture_output=True)\n"
        f"ok = {w.secret!r}.encode() in r.stdout"),
    # network
    "tcp_connect_localhost": lambda w: (
        f"import socket\nsocket.create_connection(('127.0.0.1', {w.tcp('tcp')}), timeout=1).sendall(b'x')\nok = True"),
    "tcp_via_dunder_import": lambda w: (
        f"s = __import__('so' + 'cket')\nc = s.socket(s.AF_INET, s.SOCK_STREAM)\nc.settimeout(1)\n"
        f"c.connect(('127.0.0.1', {w.tcp('dunder')}))\nok = True"),
    "udp_send": lambda w: (
        f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {w.udp('udp')}))"
        "\nok = True"),
    "unix_socket_on_host": lambda w: (
        f"import socket\nsocket.socket(socket.AF_UNIX).connect({w.unix('unix')!r})\nok = True"),
    "abstract_unix_socket": lambda w: (
        f"import socket\nsocket.socket(socket.AF_UNIX).connect({w.abstract('abstract')!r})\nok = True"),
    "docker_socket": lambda w: (
        "import socket\nfor path in ('/var/run/docker.sock', '/run/docker.sock'):\n    try:\n"
        "        socket.socket(socket.AF_UNIX).connect(path)\n        ok = True\n    except OSError:\n        pass"),
    "subprocess_client": lambda w: (
        "import subprocess, sys\nr = subprocess.run([sys.executable, '-c', 'import socket; "
        f"socket.create_connection((\"127.0.0.1\", {w.tcp('subprocess')}), timeout=1)'], timeout=5)\n"
        "ok = r.returncode == 0"),
    "curl_localhost": lambda w: (
        "import shutil, subprocess\nassert shutil.which('curl', path='/usr/bin')\n"
        f"r = subprocess.run(['/usr/bin/curl', '-s', '-m', '1', 'http://127.0.0.1:{w.tcp('curl')}/'], timeout=5)\n"
        "ok = r.returncode in (0, 28, 52)"),  # sent, timed out waiting, or empty reply: it connected
    "dns_lookup": lambda w: "import socket\nok = bool(socket.getaddrinfo('example.com', 80))",
    "raw_packet_socket": lambda w: "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)\nok = True",
    # processes, memory, time, output
    "fork_bomb": lambda w: "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "daemons_outlive_the_run": lambda w: (
        "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n        os._exit(0)"),
    "thread_bomb": lambda w: (
        "import threading, time\nn = 0\ntry:\n    for _ in range(2000):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        n += 1\n"
        "except RuntimeError:\n    pass\nprint('threads', n)\nok = n == 2000"),
    "memory_bomb": lambda w: "x = bytearray(2 << 30)\nok = True",
    "memory_bomb_gradual": lambda w: "chunks = [bytearray(16 << 20) for _ in range(64)]\nok = True",
    "mmap_bomb": lambda w: "import mmap\nm = mmap.mmap(-1, 4 << 30)\nm[-1] = 1\nok = True",
    "infinite_loop": lambda w: "while True:\n    pass",
    "sleep_forever": lambda w: "import time\ntime.sleep(3600)",
    "huge_output": lambda w: "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "fill_the_disk": lambda w: (
        "total = 0\ntry:\n    for i in range(10**6):\n        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (1 << 20))\n        total += 1 << 20\nexcept OSError as exc:\n"
        "    print('stopped at', total >> 20, 'MiB:', exc.strerror)\n"
        "ok = total >= 256 << 20"),
    "one_huge_file": lambda w: (
        "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "with open('big', 'wb') as f:\n    f.write(b'x' * (64 << 20))\nok = True"),
    "many_open_files": lambda w: "files = [open('/dev/null') for _ in range(5000)]\nok = True",
    "raise_own_rlimits": lambda w: (
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))"
        "\nok = True"),
    "renice_up": lambda w: "import os\nos.nice(-5)\nok = True",
    # signals and killing
    "kill_parent": lambda w: "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(os.getpgid(0), 9)",
    "kill_test_process_by_host_pid": lambda w: f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nok = True",
    "kill_victim_by_host_pid": lambda w: f"import os, signal\nos.kill({w.victims[1].pid}, signal.SIGKILL)\nok = True",
    "kill_minus_one": lambda w: "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "signal_storm": lambda w: (
        "import os, signal\nfor sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGSTOP):\n"
        "    for pid in range(2, 70000):\n        try:\n            os.kill(pid, sig)\n"
        "        except OSError:\n            pass"),
    # syscall tricks through ctypes
    "ctypes_unshare_user_and_net": lambda w: _libc_call("libc.unshare(0x10000000 | 0x40000000) == 0"),
    "raw_syscall_unshare": lambda w: _libc_call("libc.syscall(nr['unshare'], 0x10000000) == 0"),
    "ctypes_setuid_root": lambda w: _libc_call("libc.setuid(0) == 0"),
    "ctypes_ptrace_own_child": lambda w: _libc_call(
        "False\nimport os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(5)\n    os._exit(0)\n"
        "ok = libc.ptrace(16, pid, 0, 0) == 0"),
    "ctypes_mount_tmpfs": lambda w: _libc_call("libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0"),
    "ctypes_chroot": lambda w: _libc_call("libc.chroot(b'/tmp') == 0"),
    "io_uring_setup": lambda w: _libc_call(
        "libc.syscall(nr['io_uring_setup'], 1, ctypes.create_string_buffer(120)) >= 0"),
    "sethostname": lambda w: "import socket\nsocket.sethostname('pwned')\nok = True",
    # the harness's report channel
    "forge_result_channel": lambda w: (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'0\\n1 0\\nx 0\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)"),
    "patch_harness_builtins": lambda w: (
        "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: None"),
}
# Probes whose attack is harmless outside a sandbox: run unsandboxed to prove they detect an escape.
SAFE_UNSANDBOXED = ["read_world_readable_file", "read_root_only_token_file", "read_service_source",
                    "list_service_package", "read_etc_shadow", "symlink_to_host_root", "proc_root_of_host_process",
                    "write_outside_workdir", "write_dev_shm", "write_host_tmp", "environment_variable",
                    "proc_environ_scan", "environ_by_host_pid", "subprocess_cat_secret", "tcp_connect_localhost",
                    "tcp_via_dunder_import", "curl_localhost", "udp_send", "unix_socket_on_host", "abstract_unix_socket",
                    "subprocess_client", "ctypes_setuid_root", "ctypes_unshare_user_and_net", "raise_own_rlimits"]


def _sandbox_processes(uids: set[int]) -> list[int]:
    """Host pids running as one of `uids`: this test's sandboxes. (Not any sandbox uid: another
    pytest-xdist worker may be running sandboxes of its own tests meanwhile.)"""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid = int(next(line for line in status.read_text().splitlines() if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        if uid in uids:
            found.append(int(status.parent.name))
    return found


def _sandbox_dirs(root: Path) -> set[str]:
    return {p.name for p in root.glob("tandem-sandbox-*")}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("hostile"))
    os.environ["TANDEM_TOKEN"] = w.secret  # the service's environment holds its token
    yield w
    del os.environ["TANDEM_TOKEN"]
    w.close()


@pytest.fixture(scope="module")
def outcome(world, tmp_path_factory):
    # the sandboxes' root directories go to a folder of this test's own, so that only theirs are counted
    roots, tempdir = tmp_path_factory.mktemp("sandbox-roots"), tempfile.tempdir
    programs = {name: "ok = False\n" + make(world) for name, make in CASES.items()}
    started = time.monotonic()
    tempfile.tempdir = str(roots)
    try:
        with ThreadPoolExecutor(8) as pool:
            runs = dict(zip(programs, pool.map(lambda p: code.run_tests(p, ONLY_TEST, LIMITS), programs.values())))
    finally:
        tempfile.tempdir = tempdir
    elapsed = time.monotonic() - started
    return {"runs": runs, "elapsed_s": elapsed, "leftover_dirs": _sandbox_dirs(roots),
            "leftover_processes": _sandbox_processes({r.sandbox.uid for r in runs.values()}),
            "host_problems": world.problems()}


def test_the_suite_is_large_enough():
    assert len(CASES) >= 30 and set(SAFE_UNSANDBOXED) <= set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_program_scores_zero_and_leaks_nothing(name, world, outcome):
    run = outcome["runs"][name]
    assert not run.sandbox.setup_error
    assert run.passed == frozenset(), f"{name} passed its test: the attack worked\n{run.sandbox.output[-2000:]}"
    assert world.secret not in run.sandbox.output and world.secret.encode() not in run.sandbox.reports
    assert len(run.sandbox.output) <= LIMITS.output_bytes
    assert run.sandbox.wall_s < LIMITS.wall_s + 1.5


def test_the_host_is_untouched_after_the_suite(outcome):
    assert outcome["host_problems"] == []
    assert outcome["leftover_processes"] == [] and outcome["leftover_dirs"] == set()
    assert outcome["elapsed_s"] < 30, outcome["elapsed_s"]


def test_limits_were_what_stopped_the_bombs(outcome):
    runs = outcome["runs"]
    assert runs["sleep_forever"].sandbox.timed_out
    loop = runs["infinite_loop"]  # RLIMIT_CPU (kills the completion's process) or the wall clock (the sandbox)
    assert loop.solution_exit == -9 or loop.sandbox.exit_code == -9
    assert runs["huge_output"].sandbox.output_truncated
    assert "MemoryError" in runs["memory_bomb"].sandbox.output
    assert int(runs["thread_bomb"].sandbox.output.split("threads ")[1].split()[0]) < LIMITS.max_processes  # NPROC
    assert runs["fork_bomb"].sandbox.exit_code == -9
    assert "Too many open files" in runs["many_open_files"].sandbox.output
    assert "No space left on device" in runs["fill_the_disk"].sandbox.output  # the tmpfs size
    assert "File too large" in runs["one_huge_file"].sandbox.output  # RLIMIT_FSIZE
    assert "Address family not supported" in runs["tcp_connect_localhost"].sandbox.output  # seccomp, behind the netns


@pytest.mark.parametrize("name", SAFE_UNSANDBOXED)
def test_probe_detects_an_escape_without_the_sandbox(name, tmp_path):
    """Without the sandbox, the same program must pass its test or leave evidence."""
    control = World(tmp_path)
    try:
        program = "ok = False\n" + CASES[name](control) + "\nprint('ESCAPED' if ok else 'contained')"
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30,
                              cwd=tmp_path, env={**os.environ, "TANDEM_TOKEN": control.secret})
        assert "ESCAPED" in done.stdout or control.problems(), done.stdout + done.stderr
    finally:
        control.close()


def test_killing_the_launcher_takes_the_whole_sandbox_down(monkeypatch):
    """The service-side deadline (normally wall clock + 1 s) kills the launcher; the sandbox's
    init has SIGKILL as its parent-death signal, and the pid namespace dies with its init."""
    monkeypatch.setattr(runner, "_KILL_MARGIN_S", -1.5)  # fire before the launcher's own wall clock
    program = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(60)"
    result = runner.run_program(program, LIMITS)
    assert result.timed_out and result.exit_code == -9 and result.wall_s < LIMITS.wall_s
    deadline = time.monotonic() + 2.0
    while _sandbox_processes({result.uid}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes({result.uid}) == []
