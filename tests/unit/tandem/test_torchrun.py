"""tandem/torchrun.py: the trainer's torchrun on one host meets without a socket of its own and
hands its ranks a loopback MASTER_ADDR."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from coordinator.launch import launcher
from tandem import torchrun
from tandem.torchrun import _LOWEST_PORT, TORCHRUN_ENV, master_port, torchrun_head, torchrun_module

# Each rank prints what torchrun gave it; rank 0 also lists the TCP sockets its parent (the
# agent) listens on.
_RANK = """
import os
line = " ".join(["RANK", os.environ["RANK"], os.environ["MASTER_ADDR"], os.environ["TORCHELASTIC_USE_AGENT_STORE"],
                 os.environ["MASTER_PORT"]])
os.write(1, (line + "\\n").encode())  # one write: the ranks share the pipe
if os.environ["RANK"] == "0":
    agent = os.getppid()
    inodes = {os.readlink(f"/proc/{agent}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{agent}/fd")
              if os.readlink(f"/proc/{agent}/fd/{fd}").startswith("socket:")}
    listening = [line.split()[1] for table in ("tcp", "tcp6") for line in open(f"/proc/net/{table}").readlines()[1:]
                 if line.split()[3] == "0A" and line.split()[9] in inodes]
    os.write(1, ("AGENT_LISTENS " + str(listening) + "\\n").encode())
"""


def test_one_host_uses_a_file_rendezvous_and_a_loopback_master():
    argv = torchrun_module("trainer_svc", 2, "--settings", "t.json")
    assert "--standalone" not in argv
    assert {"--nnodes=1", "--rdzv-backend=c10d", "--rdzv-conf=store_type=file", "--local-addr=127.0.0.1"} <= set(argv)
    assert argv[argv.index("-m", 3):] == ["-m", "trainer_svc", "--settings", "t.json"]
    ids = [next(a for a in torchrun_head(2) if a.startswith("--rdzv-id=")) for _ in range(2)]
    assert ids[0] != ids[1]  # a fresh rendezvous id per launch


def test_several_nodes_meet_at_the_endpoint():
    argv = torchrun_head(4, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400", local_addr="10.0.0.2")
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-endpoint=10.0.0.1:29400", "--local-addr=10.0.0.2"} <= set(argv)
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        torchrun_head(4, nnodes=2)


def _text(line: str) -> str:
    """A line of output: off a terminal tandem.torchrun writes it as a JSON line's "text"."""
    try:
        return json.loads(line).get("text", "")
    except ValueError:
        return line


def test_the_agent_listens_on_nothing(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    done = subprocess.run([*torchrun_head(2), str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **TORCHRUN_ENV}, cwd=tmp_path, check=False)
    lines = [_text(line).split() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert sorted(line[1:4] for line in lines if line[0] == "RANK") == [["0", "127.0.0.1", "False"],
                                                                        ["1", "127.0.0.1", "False"]], done.stderr[-2000:]
    assert ["AGENT_LISTENS", "[]"] in lines, done.stdout
    # MASTER_PORT lies below the ephemeral range: no outgoing connection takes it before rank 0 listens
    ports = {int(line[4]) for line in lines if line[0] == "RANK"}
    assert len(ports) == 1 and _LOWEST_PORT <= ports.pop() < _first_ephemeral_port(), lines


def _first_ephemeral_port() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_the_master_port_is_free_and_below_the_ephemeral_range(monkeypatch, tmp_path):
    first = _first_ephemeral_port()
    ports = {master_port() for _ in range(20)}
    assert all(_LOWEST_PORT <= port < first for port in ports) and len(ports) > 1
    with socket.socket() as busy:  # a port in use is skipped
        busy.bind(("", 0))
        busy.listen()
        free = master_port()
        picks = iter([busy.getsockname()[1], free])
        monkeypatch.setattr(torchrun.random, "randrange", lambda *_: next(picks))
        assert master_port() == free
    monkeypatch.setattr(torchrun, "_EPHEMERAL_RANGE", str(tmp_path / "absent"))  # not Linux: any free port
    assert master_port() > 0


def test_the_agent_of_a_standalone_torchrun_listens_on_every_interface(tmp_path):
    """Control: the same probe finds --standalone's rendezvous store, on [::]."""
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    standalone = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(script)]
    done = subprocess.run(standalone, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **TORCHRUN_ENV}, cwd=tmp_path, check=False)
    listens = next(line for line in done.stdout.splitlines() if line.startswith("AGENT_LISTENS"))
    assert "'00000000000000000000000000000000:" in listens, listens  # [::]


def test_the_coordinator_launches_torchrun_without_a_listener():
    argv = launcher.torchrun_module("trainer_svc", 2)
    assert "--standalone" not in argv and "--rdzv-conf=store_type=file" in argv and "--local-addr=127.0.0.1" in argv


_ORPHAN = """
import os, sys, time
from tandem.torchrun import die_with_agent
die_with_agent()
with open(sys.argv[1] + "." + os.environ["RANK"], "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


def test_the_ranks_die_with_a_killed_agent(tmp_path):
    """kill -9 of torchrun's agent: its ranks (in sessions of their own) die too, rather than
    living on as orphans (an orphaned trainer rank 0 served beside the relaunched trainer)."""
    import signal
    import time

    from tests.procs import alive

    script = tmp_path / "rank.py"
    script.write_text(_ORPHAN)
    agent = subprocess.Popen([*torchrun_head(2), str(script), str(tmp_path / "pid")], cwd=tmp_path,
                             env={**os.environ, **TORCHRUN_ENV, "PYTHONPATH": os.getcwd()},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pid_files = [tmp_path / "pid.0", tmp_path / "pid.1"]
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not all(p.is_file() and p.read_text() for p in pid_files):
            assert time.monotonic() < deadline and agent.poll() is None, "the ranks did not start"
            time.sleep(0.1)
        ranks = [int(p.read_text()) for p in pid_files]
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(r) for r in ranks), "a rank outlived its agent"
    finally:
        for pid in [agent.pid, *ranks]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_die_with_agent_does_nothing_outside_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    torchrun.die_with_agent()  # no prctl, no kill: this process lives on
