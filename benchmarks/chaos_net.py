"""A network partition of one service for benchmarks/chaos.py (PARTITION): for N seconds every TCP
packet between the service's processes and the rest of the run is dropped, silently (no reset,
no refusal: the peers' connections stay open and their calls wait, as across a dead switch),
then the packets flow again and TCP's retransmissions deliver what waited.

How: the whole run lives in a network namespace of its own (benchmarks/chaos_sandbox.py,
`Sandbox(network=True)`: a user namespace makes the nemesis root there, without root here), so
the nemesis may change that namespace's packet filter. A partition finds the service's sockets
(the /proc fds of its process and every process below it, matched against the namespace's TCP
table) and drops, in a chain of its own hooked before the loopback's INPUT, every packet of each
connection whose other end is outside the service, both ways, and every new connection to a port
it listens on. Connections the service opens during the partition are found by a rescan every
`refresh_s` and cut then (so such a connection may carry packets for up to refresh_s).

Chosen over a TCP proxy the nemesis owns (a blackholing relay in front of each service): a proxy
sees only the connections routed through it, i.e. the calls to the service, and the run would
have to advertise the proxy's address instead of the service's; here nothing in the run changes,
and all of the service's traffic is cut: its gRPC server (the coordinator's calls to it), its
gRPC client (heartbeats and registration with the coordinator, the rollout gateway's calls), and
the weight-sync path, which is not gRPC (trainer rank 0's TCPStore and the gloo pairs between
the trainer and each generator: a partition mid-publish stalls the collective on both sides).
Not cut: traffic within the service (the trainer's ranks' own gloo group and torchrun's
rendezvous store; vLLM's engine process and its front end), unix sockets and shared memory.
The rules name ports only, and go to both iptables and ip6tables: gRPC's sockets are IPv6 ones
(127.0.0.1 as a mapped address, IPv4 packets on the loopback), gloo's and the stores' IPv4 ones.

Needs iptables (Debian/Ubuntu: the `iptables` package) and unprivileged user and network
namespaces; `network_available` says why not where they are missing (the kind is then left out).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from benchmarks.chaos_sandbox import Sandbox, SandboxUnavailable
from coordinator.launch.adopted import descendants

CHAIN = "TANDEM-CHAOS"
LISTEN, TIME_WAIT = "0A", "06"


def _tcp_table(pid: int) -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, inode) of each TCP socket in pid's network namespace: IPv4
    and IPv6 (gRPC's sockets are IPv6 ones, carrying IPv4 as mapped addresses)."""
    rows, lines = [], []
    for table in ("tcp", "tcp6"):
        try:
            lines += Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
    for line in lines:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
        rows.append((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), state, inode))
    return rows


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def cut_rules(root: int) -> set[str]:
    """The iptables rules (in CHAIN) that cut the service whose top process is `root` off the rest
    of its network namespace: each connection to a peer outside it, both ways, and new
    connections to the ports it listens on."""
    pids = [root, *descendants(root)]
    table = _tcp_table(root)
    mine = _socket_inodes(pids)
    sockets = [(lp, rp, st) for lp, rp, st, inode in table if inode in mine]
    own_ports = {lp for lp, _, _ in sockets}
    rules = set()
    for local, remote, state in sockets:
        if state == LISTEN:
            rules.add(f"-A {CHAIN} -p tcp --syn --dport {local} -j DROP")
        elif state != TIME_WAIT and remote not in own_ports:  # the other end is outside the service
            rules.add(f"-A {CHAIN} -p tcp --sport {local} --dport {remote} -j DROP")
            rules.add(f"-A {CHAIN} -p tcp --sport {remote} --dport {local} -j DROP")
    return rules


class Partition:
    """Cut one service off (`start`) until `stop`; rescans its sockets every refresh_s meanwhile."""

    def __init__(self, sandbox: Sandbox, root: int, *, refresh_s: float = 0.05):
        if not sandbox.network:
            raise ValueError("a partition needs the run in a network of its own: Sandbox(network=True)")
        self.sandbox, self.root, self.refresh_s = sandbox, root, refresh_s
        self.rules: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> int:
        """Cut the service off; returns how many rules that took (0: it had no connection yet)."""
        _ensure_chain(self.sandbox)
        self._apply(cut_rules(self.root))
        self._thread.start()
        return len(self.rules)

    def _apply(self, rules: set[str]) -> None:
        rules |= self.rules  # a closed connection's rules stay: its ports may be reused by the service
        if rules != self.rules:
            _restore(self.sandbox, sorted(rules))
            self.rules = rules

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self._apply(cut_rules(self.root))
            except Exception as exc:  # noqa: BLE001 - reported by stop()
                self.error = exc
                return

    def stop(self) -> None:
        """Heal: every packet flows again."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        _restore(self.sandbox, [])
        if self.error is not None:
            raise RuntimeError(f"the partition's rescan failed: {self.error}") from self.error


def _restore(sandbox: Sandbox, rules: list[str]) -> None:
    """CHAIN holds `rules` and nothing else, for IPv4 and IPv6 alike (one atomic change each)."""
    for tool in ("iptables-restore", "ip6tables-restore"):
        sandbox.inside([tool, "--noflush"], "\n".join(["*filter", f":{CHAIN} - [0:0]", *rules, "COMMIT", ""]))


def _ensure_chain(sandbox: Sandbox) -> None:
    """CHAIN exists and the loopback's INPUT goes through it first (once per sandbox)."""
    if getattr(sandbox, "_chain_ready", False):
        return
    _restore(sandbox, [f"-I INPUT 1 -j {CHAIN}"])  # -I: INPUT's rule; CHAIN itself is left empty
    sandbox._chain_ready = True


def network_available(scratch: Path) -> str | None:
    """None if a partition can be made here (a network namespace whose packet filter drops a
    connection's packets), else why not."""
    sandbox = Sandbox(scratch / "probe-net", network=True)
    try:
        sandbox.start()
        probe = ("import socket,sys\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen()\n"
                 "c=socket.create_connection(s.getsockname(),timeout=2);a,_=s.accept()\nprint(s.getsockname()[1])")
        sandbox.inside([sys.executable, "-c", probe])  # loopback is up
        _ensure_chain(sandbox)
        _restore(sandbox, [f"-A {CHAIN} -p tcp --dport 9 -j DROP"])
    except (SandboxUnavailable, RuntimeError, FileNotFoundError, OSError) as exc:
        return f"partition needs unprivileged user and network namespaces and iptables: {exc}"
    finally:
        sandbox.close()
    return None

