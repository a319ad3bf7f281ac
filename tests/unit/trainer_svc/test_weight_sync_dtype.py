"""Weights are published in the dtype the generators serve, not the checkpoint's: the coordinator
gives the trainer and the generators one dtype, and the bucket plan every publish packs into
carries it. A bf16 checkpoint trained in fp32 reaches fp32 generators as the trainer's exact fp32
weights; an fp32 checkpoint reaches bf16 generators in half the bytes."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

from coordinator.config import load_config
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import generator_settings, trainer_settings
from tests.buckets import unpack
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.publish import weight_sync_plan
from trainer_svc.types import GrpoLossConfig, Sample


def _checkpoint(target: Path, dtype: torch.dtype) -> Path:
    """The embedded tiny model saved in `dtype` (config.json says so too)."""
    source = ensure_tiny_model(cache_root())
    shutil.copytree(source, target)
    AutoModelForCausalLM.from_pretrained(source, dtype=dtype).save_pretrained(target, safe_serialization=True)
    return target


def _settings(precision: str, model_dir: Path):
    cfg = load_config(overrides=[f"policy.precision={precision}"])
    served = generator_settings(cfg, str(model_dir), 0, Path("scratch")).dtype
    return trainer_settings(cfg, str(model_dir)), served


def _samples() -> list[Sample]:
    generator = torch.Generator().manual_seed(5)
    return [Sample([1, 10 + i, 12, *torch.randint(4, 40, (4,), generator=generator).tolist()], 3,
                   generation_logprobs=[-3.0] * 4, advantage=(-1.0) ** i) for i in range(4)]


def test_bf16_checkpoint_trained_in_fp32_reaches_the_generators_exactly(world_of_one, tmp_path):
    settings, served = _settings("float32", _checkpoint(tmp_path / "bf16", torch.bfloat16))
    assert (settings.weight_sync_dtype, served) == ("float32", "float32")
    backend = DTensorBackend(settings, world_of_one)
    assert backend.checkpoint_dtype == torch.bfloat16
    backend.train_step(_samples(), GrpoLossConfig(), 4, 4, None)  # moves the weights off the bf16 grid
    trained = {name: t.clone() for name, t in backend.iter_hf_tensors()}
    assert any(not torch.equal(t, t.bfloat16().float()) for t in trained.values())

    plan = weight_sync_plan(settings, backend)
    assert {s.dtype for s in plan.tensors} == {"float32"}
    received = unpack(plan, backend.iter_hf_tensors())
    assert received.keys() == trained.keys()
    for name, tensor in trained.items():
        assert tensor.dtype == torch.float32 and torch.equal(received[name], tensor), name


def test_fp32_checkpoint_to_bf16_generators_sends_half_the_bytes():
    model_dir = ensure_tiny_model(cache_root())
    shapes = {n: tuple(t.shape) for n, t in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}
    backend = SimpleNamespace(published_tensor_shapes=shapes, checkpoint_dtype=torch.float32,
                              keep_published_in=lambda plan: False)
    settings, served = _settings("bfloat16", model_dir)
    assert (settings.weight_sync_dtype, served) == ("bfloat16", "bfloat16")
    plan = weight_sync_plan(settings, backend)
    checkpoint_plan = weight_sync_plan(settings.model_copy(update={"weight_sync_dtype": "auto"}), backend)
    assert {s.dtype for s in plan.tensors} == {"bfloat16"}
    assert sum(s.size_bytes for s in plan.tensors) * 2 == sum(s.size_bytes for s in checkpoint_plan.tensors)
    assert plan.total_bytes <= checkpoint_plan.total_bytes / 2 + 64 * len(plan.tensors)


class _Lockstep:
    def run(self, command, execute):
        return execute(command)


def test_a_shared_memory_version_is_written_in_the_generators_dtype(tmp_path):
    """Colocated on CPU the generators load each version from an HF export: in the dtype they
    serve; a user's export keeps the checkpoint's."""
    from safetensors.torch import load_file

    from trainer_svc.engine import TrainerEngine

    weights = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    backend = SimpleNamespace(rank=0, published_tensor_shapes={n: tuple(t.shape) for n, t in weights.items()},
                              checkpoint_dtype=torch.bfloat16, device=torch.device("cpu"),
                              gather_hf_state_dict=lambda: dict(weights), export_adapter=lambda path: 0,
                              keep_published_in=lambda plan: False)
    settings, _ = _settings("float32", tmp_path)
    engine = TrainerEngine(backend, _Lockstep(), model_name=str(tmp_path / "source"), log=None, sender=None,
                           fingerprint="", plan=weight_sync_plan(settings, backend))
    (tmp_path / "source").mkdir()
    engine.export_hf(str(tmp_path / "shm"), for_generators=True)
    engine.export_hf(str(tmp_path / "export"))
    served, exported = load_file(tmp_path / "shm" / "model.safetensors"), load_file(tmp_path / "export" / "model.safetensors")
    assert all(torch.equal(served[n], t) for n, t in weights.items())
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}
