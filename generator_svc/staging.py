"""Reading a weight version into memory inside vLLM's worker, from any of the three sources
(tandem.weight_source), without touching the model: the result is the HF-named tensors that
`worker_extension.TandemWeightExtension` applies later in one step.

    CollectiveSource    receive the plan's buckets over the weight-sync group (the receiver
                        joins each epoch's group once and is kept across versions); on a GPU
                        the buckets arrive two at a time into the device and are staged in
                        pinned host memory, outside vLLM's device budget (gpu_memory_utilization):
                        the device never holds a second copy of the model
    SharedMemorySource  load the safetensors files the trainer wrote (mapped, not copied twice)
    CudaIpcSource       open the trainer's buckets through their CUDA IPC handles: views of the
                        trainer's memory, valid until the load call returns
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from tandem.rpc import load_token
from tandem.weight_source import CollectiveSource, CudaIpcSource, SharedMemorySource, WeightSource
from tandem.weight_sync import WeightReceiver

HOST = torch.device("cpu")
STREAM_AHEAD = 2
"""Buckets a streamed receive keeps posted past the checksum window after the one being applied."""


class Stager:
    """One per worker: keeps the weight-sync receiver between versions."""

    def __init__(self, device: torch.device):
        self._device = device
        self._receiver: WeightReceiver | None = None

    def read(self, source: WeightSource, version: int) -> dict[str, torch.Tensor]:
        """`version`'s tensors by HF name; raises on any failure (nothing is half-read)."""
        if isinstance(source, CollectiveSource):
            return self._collective().receive(source.group, source.rank, version, source.plan)
        if isinstance(source, SharedMemorySource):
            return _read_files(source.directory, self._device)
        return _read_cuda_ipc(source, self._device)

    def stream(self, source: CollectiveSource, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """`version`'s tensors as their checksum windows arrive and pass, the next window and
        STREAM_AHEAD buckets past it received meanwhile (what is held: those, plus what the caller
        keeps); raises on any failure, part-way included."""
        return self._collective().iter_receive(source.group, source.rank, version, source.plan, ahead=STREAM_AHEAD)

    def _collective(self) -> WeightReceiver:
        if self._receiver is None:  # sealed with the run's token, which vLLM's process inherits from the service
            # staged in host memory whatever the device: vLLM's loaders copy each tensor onto the
            # device as they load it (as from a checkpoint on disk)
            self._receiver = WeightReceiver(device=self._device, secret=load_token(), stage_device=HOST)
        return self._receiver


def _read_files(directory: str, device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {directory}")
    return {name: tensor for f in files for name, tensor in load_file(str(f), device=str(device)).items()}


def _read_cuda_ipc(source: CudaIpcSource, device: torch.device) -> dict[str, torch.Tensor]:
    from tandem.cuda_ipc import import_handle, unpack_bucket

    if device.type != "cuda":
        raise RuntimeError(f"CUDA IPC weights need a generator on a GPU; this one runs on {device}")
    staged: dict[str, torch.Tensor] = {}
    for index, payload in enumerate(source.buckets):
        staged.update(unpack_bucket(source.plan, index, import_handle(payload, source.plan.bucket_sizes_bytes[index])))
    return staged
