"""FSDP2 CPU offload on a CUDA device (issue 27 defect 5; `pytest -m gpu
tests/integration/test_dtensor_gpu_offload.py`, deselected by default): with
`policy.dtensor_cfg.cpu_offload` the sharded parameters live on the CPU, the buffers and the compute
on the GPU, and two GRPO steps give the losses and grad norms of the run without offload.
The materialization device itself is decided on CPU: tests/unit/trainer_svc/test_dtensor_materialization.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from coordinator.config import load_config
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import trainer_settings
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.distributed import DistEnv
from trainer_svc.types import GrpoLossConfig, Sample

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


@pytest.fixture(scope="module")
def cuda_world(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = dist.FileStore(str(tmp_path_factory.mktemp("dist") / "store"), 1)
    dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=0, world_size=1, device_id=device)
    yield DistEnv(0, 1, 0, device, dist.new_group(backend="gloo"))
    dist.destroy_process_group()


def _samples() -> list[Sample]:
    generator = torch.Generator().manual_seed(5)
    return [Sample([1, 10 + i, 12, *torch.randint(4, 40, (4,), generator=generator).tolist()], 3,
                   generation_logprobs=[-3.0] * 4, advantage=(-1.0) ** i) for i in range(4)]


def _two_steps(env: DistEnv, offload: bool) -> tuple[list[dict], DTensorBackend]:
    overrides = ["policy.dtensor_cfg.enabled=true", f"policy.dtensor_cfg.cpu_offload={str(offload).lower()}"]
    settings = trainer_settings(load_config(overrides=overrides), str(ensure_tiny_model(cache_root())))
    backend = DTensorBackend(settings, env)
    steps = [backend.train_step(_samples(), GrpoLossConfig(), 4, 4, None).metrics for _ in range(2)]
    return steps, backend


def test_cpu_offload_trains_like_no_offload(cuda_world):
    plain, _ = _two_steps(cuda_world, offload=False)
    offloaded, backend = _two_steps(cuda_world, offload=True)
    assert {p.device.type for p in backend._model.parameters()} == {"cpu"}
    assert {b.device.type for b in backend._model.buffers()} <= {"cuda"}
    for mine, ref in zip(offloaded, plain, strict=True):
        for key in ("loss", "grad_norm"):
            assert math.isfinite(mine[key]) and abs(mine[key] - ref[key]) < 1e-3 * max(1.0, abs(ref[key])), (key, mine, ref)
