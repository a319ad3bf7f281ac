"""CUDA IPC weight handles: colocated generators on GPUs read the trainer's weights where they lie.

Trainer rank 0 packs the full HF-named tensors into flat uint8 buffers on its device, laid out by
the model's `BucketPlan` (the layout the weight-sync group uses, in the generators' dtype), and
exports one handle per bucket: the arguments of torch's `rebuild_cuda_tensor` that
`torch.multiprocessing.reductions.reduce_tensor` gives for the buffer, pickled, with the UUID of
the GPU. A generator's worker rebuilds each buffer, slices the tensors out by the plan and loads
them (generator_svc/worker_extension.py).

- Device numbering. Processes number GPUs by what CUDA_VISIBLE_DEVICES shows them, so the
  trainer's index means nothing to a generator: the receiver finds its own index of the GPU with
  the payload's UUID (an error if it cannot see that GPU).
- Lifetime. The buffers must outlive every read: the trainer keeps them until the coordinator
  says all generators confirmed (trainer_svc/cuda_ipc.py), and a generator copies the tensors
  into its model before its ReceiveWeights call returns.
- Safety. Payloads are unpickled with an unpickler that resolves only torch's tensor, storage,
  Size and dtype names; the rebuild function is fixed on the receiving side, never read from
  the payload.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from tandem.weight_sync import BucketPlan, TensorSpec

PAYLOAD_FORMAT = 1
_DEVICE_ARG = 6  # position of the storage's device index in rebuild_cuda_tensor's arguments
_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
_ALLOWED = {("torch", "Tensor"), ("torch", "Size"), ("torch.storage", "TypedStorage"),
            ("torch.storage", "UntypedStorage"), *(("torch", name) for name in _DTYPES)}


@dataclass(frozen=True)
class IpcHandle:
    """One exported bucket, as a receiver reads it."""

    device_uuid: str
    num_bytes: int
    rebuild_args: tuple


def pack_buckets(plan: BucketPlan, tensors: Iterable[tuple[str, torch.Tensor]],
                 device: torch.device) -> list[torch.Tensor]:
    """Flat uint8 buffers on `device`, one per bucket of `plan`, holding `tensors` (full
    tensors, every name of the plan once) converted to the plan's dtypes at the plan's offsets."""
    specs = {t.name: t for t in plan.tensors}
    buffers = [torch.empty(size, dtype=torch.uint8, device=device) for size in plan.bucket_sizes_bytes]
    seen: set[str] = set()
    for name, tensor in tensors:
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"tensor {name!r} is not in the bucket plan")
        if tuple(tensor.shape) != spec.shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the plan says {spec.shape}")
        flat = tensor.detach().to(device=device, dtype=getattr(torch, spec.dtype)).contiguous().view(-1)
        buffers[spec.bucket_index][spec.offset_bytes:spec.offset_bytes + spec.size_bytes].copy_(flat.view(torch.uint8))
        seen.add(name)
    missing = set(specs) - seen
    if missing:
        raise ValueError(f"{len(missing)} tensors of the plan were not given, e.g. {sorted(missing)[:3]}")
    return buffers


def unpack_bucket(plan: BucketPlan, index: int, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The HF-named tensors of bucket `index` as views into `buffer` (checked against the plan)."""
    expected = plan.bucket_sizes_bytes[index]
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() != expected:
        raise ValueError(f"bucket {index}: got a {buffer.dtype} buffer of shape {tuple(buffer.shape)}, "
                         f"the plan says {expected} bytes of uint8")
    return [(t.name, _view(buffer, t)) for t in plan.tensors if t.bucket_index == index]


def _view(buffer: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    return buffer[spec.offset_bytes:spec.offset_bytes + spec.size_bytes].view(getattr(torch, spec.dtype)).view(spec.shape)


def export_handle(buffer: torch.Tensor, device_uuid: str,
                  reduce: Callable[[torch.Tensor], tuple] | None = None) -> bytes:
    """The payload a receiver turns back into `buffer` (a CUDA uint8 tensor) with `import_handle`."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    rebuild, args = (reduce or reduce_tensor)(buffer)
    if reduce is None and rebuild is not rebuild_cuda_tensor:
        raise ValueError(f"CUDA IPC exports CUDA tensors; this one is on {buffer.device}")
    payload = {"format": PAYLOAD_FORMAT, "device_uuid": device_uuid, "num_bytes": buffer.numel(),
               "rebuild_args": tuple(args)}
    return pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)


class _TorchOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"a CUDA IPC payload may not reference {module}.{name}")
        return super().find_class(module, name)


def read_handle(payload: bytes) -> IpcHandle:
    """Decode a payload of `export_handle` (no CUDA needed: the tensor is not opened)."""
    data = _TorchOnlyUnpickler(io.BytesIO(payload)).load()
    if not isinstance(data, dict) or data.get("format") != PAYLOAD_FORMAT:
        raise ValueError(f"not a CUDA IPC payload of format {PAYLOAD_FORMAT}")
    args = data["rebuild_args"]
    if len(args) != 15 or args[5] != torch.uint8 or tuple(args[1]) != (data["num_bytes"],):
        raise ValueError("CUDA IPC payload: expected the rebuild arguments of a flat uint8 buffer "
                         f"of {data['num_bytes']} bytes")
    return IpcHandle(str(data["device_uuid"]), int(data["num_bytes"]), tuple(args))


def import_handle(payload: bytes, expected_bytes: int, device_index: Callable[[str], int] | None = None,
                  rebuild: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """Open the exported buffer in this process, on this process's index of the exporter's GPU."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    handle = read_handle(payload)
    if handle.num_bytes != expected_bytes:
        raise ValueError(f"CUDA IPC buffer has {handle.num_bytes} bytes, the plan says {expected_bytes}")
    args = list(handle.rebuild_args)
    args[_DEVICE_ARG] = (device_index or local_device_index)(handle.device_uuid)
    return (rebuild or rebuild_cuda_tensor)(*args)


def device_uuid(index: int) -> str:
    """The UUID of this process's CUDA device `index`."""
    return str(torch.cuda.get_device_properties(index).uuid)


def local_device_index(uuid: str, uuids: list[str] | None = None) -> int:
    """This process's index of the GPU with `uuid` (`uuids`: the visible devices' UUIDs in order)."""
    if uuids is None:
        uuids = [device_uuid(i) for i in range(torch.cuda.device_count())]
    if uuid not in uuids:
        raise ValueError(f"the trainer's GPU {uuid} is not visible to this process (it sees {len(uuids)}: "
                         f"{uuids}); colocated generators must see the trainer's devices (CUDA_VISIBLE_DEVICES)")
    return uuids.index(uuid)
