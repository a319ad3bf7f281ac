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

And on CPU, where every service shares the host's memory, generators may free their weights
(level 2, FREE_WEIGHTS_LEVEL) from the rollouts to the next publish, which loads every tensor
anew: the trainer's step then has the memory of the generators' copy of the model (2.5 GiB at
Qwen2.5-0.5B's shape in float32). The coordinator asks for it in synchronous runs
(policy.generation.free_weights_while_training); a generator refuses generation until a version
is loaded again.
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

FREE_WEIGHTS_LEVEL = 2
"""Sleep level of CPU generators that free their weights between the rollouts and the next
publish (the KV cache stays: nothing to wake, the publish is the wake-up)."""


@dataclass(frozen=True)
class Colocation:
    """How weights reach the generators and whether they sleep between rollouts."""

    transport: WeightTransport
    sleeps: bool
    """Generators sleep after the rollouts (freeing the device for the trainer) and wake around
    the next publish: weights first, the weights are passed, then the KV cache."""
    sleep_level: int = SLEEP_LEVEL
    """SLEEP_LEVEL (GPUs: needed for the trainer to fit) or FREE_WEIGHTS_LEVEL (CPU: memory saved,
    a generator that keeps its weights is no error)."""

    @property
    def sleep_required(self) -> bool:
        """Whether a generator that refuses to sleep fails the step (GPUs) or only keeps its memory (CPU)."""
        return self.sleep_level == SLEEP_LEVEL

    @property
    def colocated(self) -> bool:
        return self.transport is not WeightTransport.GROUP


def resolve_colocation(colocated: bool, device_type: str, shares_device: bool = False,
                       free_weights: bool = False) -> Colocation:
    """The transport and sleep policy for `colocated` generators next to a `device_type`
    ("cpu" or "cuda", torch's device kinds) trainer; `shares_device`: dedicated generators placed
    on the trainer's GPU; `free_weights`: CPU generators free their weights while the trainer works."""
    frees = free_weights and device_type == "cpu"
    if not colocated:
        if shares_device and device_type == "cuda":
            return Colocation(WeightTransport.CUDA_IPC, sleeps=False)
        return Colocation(WeightTransport.GROUP, sleeps=frees, sleep_level=FREE_WEIGHTS_LEVEL)
    if device_type == "cpu":
        return Colocation(WeightTransport.SHARED_MEMORY, sleeps=frees, sleep_level=FREE_WEIGHTS_LEVEL)
    if device_type == "cuda":
        return Colocation(WeightTransport.CUDA_IPC, sleeps=True)
    raise ValueError(f"colocated generation runs on CPU (shared memory) or CUDA GPUs (CUDA IPC), not on "
                     f"{device_type!r} devices; set policy.generation.colocated.enabled=false")
