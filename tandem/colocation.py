"""Where the generators run relative to the trainer, and what follows from it: the one place
that turns `policy.generation.colocated.enabled` and a device kind into a weight transport
and a sleep policy. The coordinator asks it with the trainer's device, a generator with its
own vLLM platform's; both get the same answer because colocated services share the devices.

    colocated  device  weights travel by                      generators sleep while the trainer works
    no         any     the weight-sync group (gloo / NCCL)    no (they have devices of their own)
    no, on the cuda    CUDA IPC handles of the trainer's      no (dedicated: the device is split by
    trainer's GPU      buckets (NCCL refuses two ranks on     gpu_memory_utilization; coordinator/
                       one device)                            config/placement.py, a one-GPU node)
    yes        cpu     safetensors files in shared memory     no (vLLM on CPU has no sleep mode)
    yes        cuda    CUDA IPC handles of the trainer's      yes: level 1 (weights to host memory,
                       buckets                                KV cache dropped), woken around a publish
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class WeightTransport(str, Enum):
    GROUP = "group"
    """Broadcast over the weight-sync process group (dedicated generators)."""
    SHARED_MEMORY = "shared_memory"
    """HF safetensors files on the host's shared memory (colocated on CPU)."""
    CUDA_IPC = "cuda_ipc"
    """CUDA IPC handles of buckets on the trainer's device (colocated on GPUs)."""


SLEEP_LEVEL = 1
"""vLLM sleep level of colocated GPU generators: weights offloaded to host memory (woken, then
overwritten by the publish), KV cache discarded."""


@dataclass(frozen=True)
class Colocation:
    """How weights reach the generators and whether they sleep between rollouts."""

    transport: WeightTransport
    sleeps: bool
    """Generators sleep after the rollouts (freeing the device for the trainer) and wake around
    the next publish: weights first, the weights are passed, then the KV cache."""

    @property
    def colocated(self) -> bool:
        return self.transport is not WeightTransport.GROUP


def resolve_colocation(colocated: bool, device_type: str, shares_device: bool = False) -> Colocation:
    """The transport and sleep policy for `colocated` generators next to a `device_type`
    ("cpu" or "cuda", torch's device kinds) trainer; `shares_device`: dedicated generators placed
    on the trainer's GPU."""
    if not colocated:
        if shares_device and device_type == "cuda":
            return Colocation(WeightTransport.CUDA_IPC, sleeps=False)
        return Colocation(WeightTransport.GROUP, sleeps=False)
    if device_type == "cpu":
        return Colocation(WeightTransport.SHARED_MEMORY, sleeps=False)
    if device_type == "cuda":
        return Colocation(WeightTransport.CUDA_IPC, sleeps=True)
    raise ValueError(f"colocated generation runs on CPU (shared memory) or CUDA GPUs (CUDA IPC), not on "
                     f"{device_type!r} devices; set policy.generation.colocated.enabled=false")
