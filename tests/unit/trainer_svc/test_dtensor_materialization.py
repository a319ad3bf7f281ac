"""FSDP2's CPU offload on a GPU (issue 27 defect 5): the meta-device model's sharded parameters
are materialised on the CPU when `dtensor_cfg.cpu_offload` is on (torch's FSDP2 refuses others in
`FSDPParamGroup._validate_cpu_offload_params`), its buffers on the compute device. Decided here on
CPU for both device types; the run on a GPU: tests/integration/test_dtensor_gpu_offload.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from coordinator.config import load_config
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import trainer_settings
from trainer_svc.backends.dtensor import model as dtensor_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.backends.dtensor.parallel import Materialization, materialization
from trainer_svc.distributed import DistEnv


@pytest.mark.parametrize(("device", "offload", "params", "buffers"), [
    ("cpu", False, "cpu", "cpu"), ("cpu", True, "cpu", "cpu"),
    ("cuda:0", False, "cuda:0", "cuda:0"), ("cuda:1", True, "cpu", "cuda:1")])
def test_materialization_device_per_device_type_and_offload(device, offload, params, buffers):
    assert materialization(torch.device(device), offload) == Materialization(torch.device(params),
                                                                            torch.device(buffers))


def test_buffers_move_to_the_compute_device_and_parameters_stay():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model.to_empty(device="cpu")
    dtensor_model._move_buffers(model, torch.device("meta"))  # any device other than the parameters'
    assert {b.device.type for b in model.buffers()} == {"meta"}
    assert {p.device.type for p in model.parameters()} == {"cpu"}


@pytest.fixture
def world_of_one(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield DistEnv(0, 1, 0, torch.device("cpu"), dist.group.WORLD)
    dist.destroy_process_group()


@pytest.mark.parametrize("offload", [False, True])
def test_the_backend_materialises_where_the_plan_says(world_of_one, monkeypatch, offload):
    """The backend asks `materialization` with the offload it shards with, and follows it."""
    asked = []

    def recorded(device, cpu_offload):
        asked.append((device, cpu_offload))
        return materialization(device, cpu_offload)

    monkeypatch.setattr(dtensor_model, "materialization", recorded)
    overrides = ["policy.dtensor_cfg.enabled=true", f"policy.dtensor_cfg.cpu_offload={str(offload).lower()}"]
    settings = trainer_settings(load_config(overrides=overrides), str(ensure_tiny_model(cache_root())))
    backend = DTensorBackend(settings, world_of_one)
    assert asked == [(torch.device("cpu"), offload)]
    assert {p.device.type for p in backend._model.parameters()} == {"cpu"}
