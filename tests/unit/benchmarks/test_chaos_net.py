"""benchmarks/chaos_net.py's partition on real processes in a network namespace of their own: a
"service" (a listener, and a child process holding a connection to it) and a peer outside it.
The service listens as gRPC does (an IPv6 socket, 127.0.0.1 as a
mapped address: it shows in /proc's tcp6 table; the first partitions missed it). While the
service is cut off, the peer's calls on its open connection get no answer and no error
(a silent partition) and a new connection to it gets nowhere, while the connection inside the
service goes on; once healed, what waited is delivered and new connections work again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.chaos_net import Partition, network_available
from benchmarks.chaos_sandbox import Sandbox

SERVICE = r"""
import socket, subprocess, sys, threading
s = socket.socket(socket.AF_INET6); s.bind(("::ffff:127.0.0.1", 0)); s.listen()  # as gRPC's: an IPv6 socket
port = s.getsockname()[1]
child = '''
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); n = 0
while True:
    c.sendall(b"i"); c.recv(1); n += 1
    open(sys.argv[2], "w").write(str(n)); time.sleep(0.02)
'''
subprocess.Popen([sys.executable, "-c", child, str(port), sys.argv[1]])
def echo(conn):
    while data := conn.recv(100):
        conn.sendall(data)
print(port, flush=True)
while True:
    threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()
"""

PEER = r"""
import socket, sys
port = int(sys.argv[1]); c = socket.create_connection(("127.0.0.1", port), timeout=5)
for line in sys.stdin:
    wait = float(line.split()[1])
    try:
        if line.startswith("new"):
            socket.create_connection(("127.0.0.1", port), timeout=wait).close(); print("connected", flush=True)
            continue
        if line.startswith("send"):
            c.sendall(b"x")
        c.settimeout(wait); print("answered" if c.recv(1) == b"x" else "closed", flush=True)
    except TimeoutError:
        print("silence", flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
"""


def _ask(peer: subprocess.Popen, line: str) -> str:
    peer.stdin.write(line + "\n")
    peer.stdin.flush()
    return peer.stdout.readline().strip()


def _count(path: Path) -> int:
    return int(path.read_text() or 0) if path.is_file() else 0


def test_a_partition_silences_a_service_s_connections_to_the_rest_and_spares_its_own(tmp_path):
    why = network_available(tmp_path)
    if why:
        pytest.skip(why)
    sandbox = Sandbox(tmp_path / "sandbox", network=True)
    sandbox.start()
    inside = sandbox.prefix(tmp_path)
    counter = tmp_path / "internal-round-trips"
    service = subprocess.Popen([*inside, sys.executable, "-c", SERVICE, str(counter)], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    peer = None
    try:
        port = service.stdout.readline().strip()
        peer = subprocess.Popen([*inside, sys.executable, "-c", PEER, port], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert _ask(peer, "send 5") == "answered"
        partition = Partition(sandbox, service.pid)
        assert partition.start() >= 3  # the listener, and the peer's connection both ways
        cut = time.monotonic()
        before = _count(counter)
        assert _ask(peer, "send 1") == "silence"  # no answer, no reset: the peer cannot tell
        assert _ask(peer, "new 1") == "silence"
        deadline = time.monotonic() + 20  # the child's connection to its parent is inside the service: it goes on
        while _count(counter) <= before + 5 and time.monotonic() < deadline:  # (however slowly a loaded machine runs it)
            time.sleep(0.05)
        assert _count(counter) > before + 5
        partition.stop()
        # what the partition held back arrives with TCP's next retransmission, whose interval doubles
        # each time: up to about as long again as the partition lasted (long on a loaded machine)
        held = time.monotonic() - cut
        assert _ask(peer, f"wait {max(10.0, 2 * held + 5):.0f}") == "answered"
        assert _ask(peer, "new 5") == "connected"
        assert _ask(peer, "send 5") == "answered"
    finally:
        if peer is not None:
            peer.kill()
            peer.wait()
        os.killpg(service.pid, signal.SIGKILL)  # the service and its child
        service.wait()
        sandbox.close()
