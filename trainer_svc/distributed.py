"""Process-group setup for the trainer's ranks (torchrun's env:// rendezvous).

The default group carries the backend's collectives (gloo on CPU, NCCL for CUDA tensors with
gloo beside it for CPU tensors); a separate gloo group with a long timeout carries lockstep
commands and Python-object gathers, because ranks other than 0 wait on it between RPCs.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """This rank's place in the trainer's world."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    cpu_group: dist.ProcessGroup
    """gloo group over all ranks with the lockstep timeout (commands, object gathers)."""


def init_distributed(lockstep_timeout_s: float) -> DistEnv:
    """Join torchrun's world (or make a 1-rank world when started without torchrun)."""
    if "RANK" not in os.environ:  # plain `python -m trainer_svc`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=lockstep_timeout_s))
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, cpu_group)


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
