"""How the trainer's torchrun is launched so that it opens no listener beyond the ones it needs.

`--standalone` makes torchrun's agent host its rendezvous in a TCPStore on every interface
("localhost:0" is only the address it tells others; torch 2.13 binds [::]). On one host the
rendezvous needs no socket at all: a c10d rendezvous on a FileStore (a fresh 0600 file per
launch, made by mkstemp: only the run's user can open it) meets the same way, and
`--local-addr=127.0.0.1` makes MASTER_ADDR loopback, where trainer_svc/distributed.py serves
the default group's store. The agent must not share its store with the ranks, so the launch
environment carries TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (`TORCHRUN_ENV`).

Several nodes still meet in a TCP c10d rendezvous at `rdzv_endpoint`; torch binds that store
on every interface of the node that hosts it (keep the rendezvous port behind the cluster's
firewall); MASTER_ADDR is `local_addr`, the address the nodes reach each other at.

`python -m tandem.torchrun [torchrun arguments]` is torchrun (torch.distributed.run) with three
differences for a service: when its stderr is not a terminal, its own output and its workers'
are JSON lines like every service's (tandem/process_logs.py); a stop signal (SIGTERM from
`docker stop` or the coordinator) that it forwards to the workers, which drain and exit, ends
it with code 0 instead of a traceback; and MASTER_PORT is a free port below the kernel's
ephemeral range (`master_port`). torchrun picks it by binding port 0 and closing the socket;
rank 0 binds it again only seconds later, once it has imported torch, and meanwhile any
outgoing connection on the host could be given that same port as its own end ("the store
cannot listen on 127.0.0.1:P: Address already in use", seen in a full test run). Below the
ephemeral range the kernel never hands a port out by itself. `torchrun_head` launches it.

A worker dies with its agent (`die_with_agent`, called by every trainer rank as it starts): torch
starts the ranks in sessions of their own, so once a SIGKILL took the agent nothing else would
stop them (the launcher finds a service's processes through its leader, and the agent's children
pass to init), and the orphaned rank 0 would go on serving and heartbeating as the trainer
beside the one the coordinator relaunches (found by benchmarks/chaos.py).
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import sys
import uuid

TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""Environment torchrun needs for the above (the ranks serve their own store)."""


def torchrun_head(nproc: int, *, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
                  rdzv_id: str = "tandem", local_addr: str = "127.0.0.1") -> list[str]:
    """torchrun's argv up to the program: one host (nnodes=1, no listener of its own, MASTER_ADDR
    127.0.0.1) or one node of a c10d rendezvous at rdzv_endpoint (MASTER_ADDR local_addr)."""
    head = [sys.executable, "-m", "tandem.torchrun", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        return [*head, "--nnodes=1", "--rdzv-backend=c10d", "--rdzv-conf=store_type=file",
                f"--rdzv-id={uuid.uuid4().hex}", "--local-addr=127.0.0.1"]
    if not rdzv_endpoint:
        raise ValueError("a trainer on several nodes needs rdzv_endpoint HOST:PORT (the same on every node)")
    return [*head, f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}", f"--local-addr={local_addr}"]


def torchrun_module(module: str, nproc: int, *args: str) -> list[str]:
    """`python -m module args` under torchrun on this host, nproc ranks (coordinator/launch/launcher.py's
    signature)."""
    return [*torchrun_head(nproc), "-m", module, *args]


_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST_PORT = 10000  # above the registered ports most services use


def master_port(tries: int = 200) -> int:
    """A TCP port that is free now (bound, then released) and below the range the kernel picks
    ephemeral ports from, so that no outgoing connection takes it before rank 0 listens on it.
    Where that range is unknown (not Linux) or too low, any free port, as torchrun picks it."""
    try:
        with open(_EPHEMERAL_RANGE) as f:
            first_ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = _LOWEST_PORT
    for _ in range(tries if first_ephemeral > _LOWEST_PORT else 0):
        port = random.randrange(_LOWEST_PORT, first_ephemeral)
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return port
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


_PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    """Under torchrun (TORCHELASTIC_RUN_ID set), make this worker get SIGKILL when its agent
    (its parent) dies; if the agent is gone already, die now. Elsewhere (a plain `python -m
    trainer_svc`, a world of one) nothing changes. Linux only (prctl); a no-op where it is absent."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    agent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if agent == 1 or os.getppid() != agent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    json_lines = not sys.stderr.isatty()
    if json_lines:
        from tandem.process_logs import json_everywhere

        json_everywhere("torchrun")
    import torch.distributed.elastic.rendezvous.api as rendezvous
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    rendezvous.get_free_port = master_port  # what RendezvousStoreInfo.build calls for MASTER_PORT

    if json_lines:  # torch gives its own loggers a plain-text handler when it is imported
        from tandem.process_logs import route_stdlib_logging

        route_stdlib_logging("torchrun")
    try:
        torchrun()
    except SignalException as exc:
        from tandem.logs import configure_logging

        configure_logging("torchrun").info("torchrun_stopped", signal=exc.sigval.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
