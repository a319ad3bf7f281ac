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

`python -m tandem.torchrun [torchrun arguments]` is torchrun (torch.distributed.run) with two
differences for a service: when its stderr is not a terminal, its own output and its workers'
are JSON lines like every service's (tandem/process_logs.py), and a stop signal (SIGTERM from
`docker stop` or the coordinator) that it forwards to the workers, which drain and exit, ends
it with code 0 instead of a traceback. `torchrun_head` launches it.
"""

from __future__ import annotations

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
    """`python -m module args` under torchrun on this host, nproc ranks (coordinator/launcher.py's
    signature)."""
    return [*torchrun_head(nproc), "-m", module, *args]


def main() -> int:
    json_lines = not sys.stderr.isatty()
    if json_lines:
        from tandem.process_logs import json_everywhere

        json_everywhere("torchrun")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

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
