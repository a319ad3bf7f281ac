"""Process-group setup for the trainer's ranks (torchrun's MASTER_ADDR/MASTER_PORT, RANK,
WORLD_SIZE).

The default group carries the backend's collectives (gloo on CPU, NCCL for CUDA tensors with
gloo beside it for CPU tensors); a separate gloo group with a long timeout carries lockstep
commands and Python-object gathers, because ranks other than 0 wait on it between RPCs.

Its store is made here rather than by torch's env:// rendezvous, whose TCPStore binds every
interface: rank 0 serves it on MASTER_ADDR only (127.0.0.1 on one host: torchrun's
`--local-addr`, see tandem/torchrun.py), sealed with the run's token when one is given
(tandem/stores.py), and on a loopback MASTER_ADDR the groups' own gloo/NCCL sockets are kept
on the loopback interface too. torchrun must not share its agent store with the workers
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): that store would listen on every interface.
"""

from __future__ import annotations

import datetime
import os
import socket
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tandem.stores import SealedStore, loopback_collectives_env, serve_store

_KEEP: list[object] = []  # the stores the default group was built on: alive as long as the process


@dataclass(frozen=True)
class DistEnv:
    """This rank's place in the trainer's world."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    cpu_group: dist.ProcessGroup
    """gloo group over all ranks with the lockstep timeout (commands, object gathers)."""


def init_distributed(lockstep_timeout_s: float, secret: str | None = None) -> DistEnv:
    """Join torchrun's world (or make a 1-rank world when started without torchrun).

    `secret` (the run's token; the trainer service always passes it) seals the default
    group's store; None leaves it unsealed, still bound to MASTER_ADDR only (tests, benchmarks).
    """
    if "RANK" not in os.environ:  # plain `python -m trainer_svc`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    store = default_group_store(rank, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), secret)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=rank, world_size=world_size, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=lockstep_timeout_s))
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, cpu_group)


def default_group_store(rank: int, master_addr: str, master_port: int, secret: str | None) -> dist.Store:
    """The default group's store: served by rank 0 on master_addr:master_port alone, reached
    there by the others; sealed with `secret` when given."""
    for name, value in loopback_collectives_env(master_addr).items():
        os.environ.setdefault(name, value)
    timeout = dist.constants.default_pg_timeout
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun serves it (every interface)
        warnings.warn("torchrun shares its agent store with the trainer's ranks, a store that listens on every "
                      "interface: launch torchrun as tandem/torchrun.py does (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)",
                      stacklevel=2)
        store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timeout)
    elif rank == 0:
        store = serve_store(master_addr, master_port, timeout.total_seconds())
    else:
        store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timeout)
    _KEEP.append(store)
    if secret is not None:
        store = SealedStore(store, secret, "trainer-default-group")
        _KEEP.append(store)
    return store


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
