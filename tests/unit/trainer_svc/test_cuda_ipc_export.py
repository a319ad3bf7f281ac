"""The trainer's CUDA IPC exports without a GPU: buckets held until released (fake reduce on CPU
buffers), a later export replacing an unreleased one, a CPU trainer refusing, and the wire round
trip of ExportCudaIpcWeights / ReleaseCudaIpcWeights."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import structlog
import torch

from tandem.cuda_ipc import read_handle, unpack_bucket
from tandem.rpc import FailedPrecondition
from tandem.weight_sync import plan_for_state_dict
from trainer_svc.client import TrainerClient
from trainer_svc.cuda_ipc import CudaIpcExports
from trainer_svc.engine import TrainerEngine
from trainer_svc.server import TrainerServicer
from trainer_svc.types import CudaIpcExport

STATE = {"a.weight": torch.arange(6.0).view(2, 3), "b.bias": torch.ones(5)}
PLAN = plan_for_state_dict(STATE, bucket_bytes=32)


def _reduce(buffer):
    storage = buffer._typed_storage()
    return "fake", (type(buffer), buffer.size(), buffer.stride(), 0, type(storage), buffer.dtype, 0,
                    b"handle", buffer.numel(), 0, False, b"ref", 0, b"event", True)


def _exports():
    emptied = []
    exports = CudaIpcExports(torch.device("cpu"), structlog.get_logger(), reduce=_reduce,
                             uuid_of=lambda index: f"GPU-{index}", empty_cache=lambda: emptied.append(1))
    return exports, emptied


def test_buckets_are_held_until_their_version_is_released():
    exports, emptied = _exports()
    payloads = exports.export(3, PLAN, STATE.items(), leader=True)
    assert len(payloads) == len(PLAN.bucket_sizes_bytes) == 2
    assert {read_handle(p).device_uuid for p in payloads} == {"GPU-0"}
    held = exports._held[1]
    assert torch.equal(dict(unpack_bucket(PLAN, 0, held[0]))["a.weight"], STATE["a.weight"])
    assert exports.release(2) is False and exports.held_version == 3  # another version's are kept
    assert exports.release(3) is True and exports.held_version is None
    assert len(emptied) == 3  # export and both releases empty the CUDA cache


def test_a_new_export_replaces_an_unreleased_one_and_followers_hold_nothing():
    exports, _ = _exports()
    exports.export(1, PLAN, STATE.items(), leader=True)
    exports.export(2, PLAN, STATE.items(), leader=True)
    assert exports.held_version == 2
    follower, _ = _exports()
    part = iter(STATE.items())  # a follower's part of the collective export: run, not kept
    assert follower.export(2, PLAN, part, leader=False) is None and follower.held_version is None
    assert next(part, None) is None


def test_a_tensor_the_plan_does_not_expect_fails_after_the_export_ran_to_its_end():
    exports, _ = _exports()
    wrong = [("a.weight", STATE["a.weight"]), ("c.weight", torch.ones(2)), ("b.bias", STATE["b.bias"])]
    part = iter(wrong)
    with pytest.raises(ValueError, match="c.weight"):
        exports.export(1, PLAN, part, leader=True)
    assert next(part, None) is None and exports.held_version is None  # the other ranks' gathers completed


def test_a_cpu_trainer_refuses_cuda_ipc():
    backend = SimpleNamespace(device=torch.device("cpu"), rank=0)
    engine = TrainerEngine(backend, None, model_name="m", plan=PLAN, sender=None, fingerprint="", log=structlog.get_logger())
    with pytest.raises(FailedPrecondition, match="shared memory"):
        engine.export_cuda_ipc(1)


class _WireStub:
    def __init__(self, servicer):
        self._servicer = servicer

    def __getattr__(self, name):
        def call(request, timeout):
            parsed = type(request).FromString(request.SerializeToString())
            reply = asyncio.run(getattr(self._servicer, name)(parsed, None))
            return type(reply).FromString(reply.SerializeToString())
        return call


def test_the_wire_carries_export_and_release():
    calls = []

    class Engine:
        def export_cuda_ipc(self, version):
            calls.append(("export", version))
            return CudaIpcExport(version, (b"\x00one", b"two\xff"), 96, 5)

        def release_cuda_ipc(self, version):
            calls.append(("release", version))
            return True

    with ThreadPoolExecutor(1) as pool:
        client = TrainerClient("127.0.0.1:1", None)
        client._stub = _WireStub(TrainerServicer(Engine(), pool))
        assert client.export_cuda_ipc(4) == CudaIpcExport(4, (b"\x00one", b"two\xff"), 96, 5)
        assert client.release_cuda_ipc(4) is True
        client.close()
    assert calls == [("export", 4), ("release", 4)]
