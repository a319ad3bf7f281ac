"""Where the Megatron model is built and kept (issue 27 defects 1 and 2), decided on a CPU machine:
the plan per device type, the move to the current CUDA device before DDP wraps the model (as
Megatron-LM's `get_model` does), and the torch norm under sequence parallelism on GPUs. The run
on a real GPU: tests/integration/test_megatron_gpu_placement.py (`pytest -m gpu`)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from coordinator.config import load_config
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import trainer_settings
from trainer_svc.backends.megatron import backend as megatron_backend
from trainer_svc.backends.megatron import placement as placement_mod
from trainer_svc.backends.megatron.model import Layout
from trainer_svc.backends.megatron.placement import ModelPlacement
from trainer_svc.distributed import DistEnv


class _Recorder(torch.nn.Module):
    """A module that records `.cuda()` instead of needing a CUDA device."""

    def __init__(self, log: list):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))
        self.log = log

    def cuda(self, device=None):
        self.log.append(("cuda", torch.device(device)))
        return self


def test_cpu_plan_keeps_cpu_initialization_and_does_not_move():
    plan = ModelPlacement.for_device("cpu", sequence_parallel=True)
    assert (plan.on_gpu, plan.cpu_initialization, plan.cpu_compat) == (False, True, True)
    assert plan.target() == torch.device("cpu")
    log: list = []
    model = _Recorder(log)
    assert plan.place(model) is model and log == []


def test_cuda_plan_initialises_on_the_device_and_moves_to_the_current_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    plan = ModelPlacement.for_device(torch.device("cuda", 1))
    assert (plan.on_gpu, plan.cpu_initialization, plan.cpu_compat) == (True, False, False)
    log: list = []
    plan.place(_Recorder(log))
    assert log == [("cuda", torch.device("cuda", 1))]


def test_cuda_plan_refuses_a_device_other_than_the_current_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(RuntimeError, match="set_device"):
        ModelPlacement.for_device("cuda:1").target()
    with pytest.raises(ValueError, match="mps"):
        ModelPlacement.for_device("mps")


@pytest.mark.parametrize(("device", "sp", "te", "patch"), [
    ("cuda", True, False, True), ("cuda", True, True, False), ("cuda", False, False, False),
    ("cpu", True, False, True), ("cpu", False, False, False)])
def test_torch_norm_patch_goes_with_the_local_spec_under_sp_on_every_device(device, sp, te, patch):
    assert ModelPlacement.for_device(device, sequence_parallel=sp, use_te=te).torch_norm_sp_patch is patch


def test_prepared_cuda_plan_builds_the_torch_norm_under_sp(monkeypatch):
    from megatron.core.transformer import torch_norm

    monkeypatch.setattr(torch_norm.WrappedTorchNorm, "__new__", torch_norm.WrappedTorchNorm.__new__)
    monkeypatch.setattr(placement_mod, "_NORM_PATCHED", False)
    config = SimpleNamespace(layernorm_zero_centered_gamma=False, persist_layer_norm=False, sequence_parallel=True,
                             memory_efficient_layer_norm=False, normalization="RMSNorm")
    ModelPlacement.for_device("cuda", sequence_parallel=True).prepare()
    norm = torch_norm.WrappedTorchNorm(config, 8)
    assert isinstance(norm, torch.nn.RMSNorm) and config.sequence_parallel
    assert all(getattr(p, "sequence_parallel", False) for p in norm.parameters())


class _Stop(Exception):
    pass


def test_backend_builds_on_cuda_and_moves_before_loading_and_ddp(monkeypatch):
    """The backend's order on a CUDA rank, with megatron-core's calls recorded (no GPU needed)."""
    log: list = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(megatron_backend.cpu_compat, "active", contextlib.nullcontext)
    monkeypatch.setattr(megatron_backend, "init_model_parallel", lambda cfg, seed: Layout(0, 1, 0, 1, 0, 1))

    def config(arch, cfg, dtype, *, cpu_initialization=True):
        log.append(("config", cpu_initialization))
        return SimpleNamespace()

    monkeypatch.setattr(megatron_backend, "transformer_config", config)
    monkeypatch.setattr(megatron_backend, "build_gpt_model", lambda *a, **k: _Recorder(log))
    monkeypatch.setattr(megatron_backend, "load_weights", lambda *a, **k: log.append(("load",)) or ("cached", 0.0))

    def wrap(model, config, cfg):
        log.append(("ddp",))
        raise _Stop

    monkeypatch.setattr(megatron_backend, "wrap_ddp", wrap)
    model_dir = ensure_tiny_model(cache_root())
    settings = trainer_settings(load_config(overrides=["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]), str(model_dir))
    env = DistEnv(0, 1, 0, torch.device("cuda", 0), None)
    with pytest.raises(_Stop):
        megatron_backend.MegatronBackend(settings, env)
    assert log == [("config", False), ("cuda", torch.device("cuda", 0)), ("load",), ("ddp",)]
