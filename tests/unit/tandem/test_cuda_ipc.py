"""CUDA IPC payloads without a GPU: buckets packed by the plan, the handle pickled and read back
through the torch-only unpickler, the device mapped by UUID, the tensors sliced out and checked.
torch's reduce/rebuild pair is replaced by a fake that keeps buffers in a dict (CPU tensors)."""

import os
import pickle

import pytest
import torch

from tandem.colocation import WeightTransport, resolve_colocation
from tandem.cuda_ipc import (
    export_handle,
    import_handle,
    local_device_index,
    pack_buckets,
    read_handle,
    unpack_bucket,
)
from tandem.weight_sync import plan_for_state_dict

_SHARED: dict[bytes, torch.Tensor] = {}


def _fake_reduce(buffer):
    """The argument layout of torch's rebuild_cuda_tensor, with a fake memory handle."""
    handle = os.urandom(16)
    _SHARED[handle] = buffer
    storage = buffer._typed_storage()
    return "rebuild_cuda_tensor", (type(buffer), buffer.size(), buffer.stride(), 0, type(storage), buffer.dtype,
                                   3, handle, buffer.numel(), 0, False, b"ref", 0, b"event", True)


def _fake_rebuild(*args):
    assert args[6] == 1, "the trainer's device 3 is this process's device 1"
    return _SHARED[args[7]]


def _state():
    torch.manual_seed(0)
    return {"embed.weight": torch.randn(5, 4), "layer.bias": torch.randn(7), "head.weight": torch.randn(3, 4)}


def test_buckets_round_trip_through_the_payload_with_device_mapping():
    state = _state()
    plan = plan_for_state_dict(state, dtype=torch.bfloat16, bucket_bytes=64)
    assert len(plan.bucket_sizes_bytes) > 1
    buffers = pack_buckets(plan, state.items(), torch.device("cpu"))
    payloads = [export_handle(b, "GPU-trainer", reduce=_fake_reduce) for b in buffers]
    received = {}
    for index, payload in enumerate(payloads):
        buffer = import_handle(payload, plan.bucket_sizes_bytes[index], rebuild=_fake_rebuild,
                               device_index=lambda uuid: local_device_index(uuid, ["GPU-other", "GPU-trainer"]))
        received.update(unpack_bucket(plan, index, buffer))
    assert list(received) == list(state)
    for name, tensor in state.items():
        assert received[name].dtype == torch.bfloat16 and received[name].shape == tensor.shape
        assert torch.equal(received[name], tensor.to(torch.bfloat16))


def test_read_handle_needs_no_cuda_and_checks_the_layout():
    buffer = torch.zeros(32, dtype=torch.uint8)
    handle = read_handle(export_handle(buffer, "GPU-x", reduce=_fake_reduce))
    assert (handle.device_uuid, handle.num_bytes, len(handle.rebuild_args)) == ("GPU-x", 32, 15)
    with pytest.raises(ValueError, match="plan says 64"):
        import_handle(export_handle(buffer, "GPU-x", reduce=_fake_reduce), 64, rebuild=_fake_rebuild)
    floats = export_handle(torch.zeros(8), "GPU-x", reduce=_fake_reduce)
    with pytest.raises(ValueError, match="flat uint8"):
        read_handle(floats)


def test_a_payload_that_references_anything_but_torch_types_is_refused():
    class Evil:
        def __reduce__(self):
            return os.system, ("echo owned",)

    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        read_handle(pickle.dumps({"format": 1, "device_uuid": "x", "num_bytes": 1, "rebuild_args": Evil()}))
    with pytest.raises(ValueError, match="format"):
        read_handle(pickle.dumps({"format": 99}))


def test_the_generator_must_see_the_trainers_gpu():
    assert local_device_index("GPU-b", ["GPU-a", "GPU-b"]) == 1
    with pytest.raises(ValueError, match="not visible.*CUDA_VISIBLE_DEVICES"):
        local_device_index("GPU-c", ["GPU-a", "GPU-b"])


def test_pack_checks_names_shapes_and_completeness():
    state = _state()
    plan = plan_for_state_dict(state)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="not in the bucket plan"):
        pack_buckets(plan, [*state.items(), ("extra", torch.zeros(1))], cpu)
    with pytest.raises(ValueError, match="shape"):
        pack_buckets(plan, [("layer.bias", torch.zeros(8)), *list(state.items())[:1]], cpu)
    with pytest.raises(ValueError, match="were not given"):
        pack_buckets(plan, list(state.items())[:2], cpu)
    with pytest.raises(ValueError, match="plan says"):
        unpack_bucket(plan, 0, torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="CUDA tensors"):
        export_handle(torch.zeros(4, dtype=torch.uint8), "GPU-x")  # torch's own reduce: a CPU tensor is no IPC handle


def test_colocation_is_decided_from_the_device_kind_in_one_place():
    assert resolve_colocation(False, "cuda").transport is WeightTransport.GROUP
    assert not resolve_colocation(False, "cuda").sleeps and not resolve_colocation(False, "cpu").colocated
    cpu = resolve_colocation(True, "cpu")
    assert (cpu.transport, cpu.sleeps) == (WeightTransport.SHARED_MEMORY, False)
    gpu = resolve_colocation(True, "cuda")
    assert (gpu.transport, gpu.sleeps, gpu.colocated) == (WeightTransport.CUDA_IPC, True, True)
    with pytest.raises(ValueError, match="colocated.enabled=false"):
        resolve_colocation(True, "mps")
