"""Settings derived at validation, never written into a frozen model afterwards: the trainer's
backend and the generator's executor and GPU memory share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from generator_svc.config import GeneratorSettings, VllmSettings
from trainer_svc.config import TrainerSettings, TrainingBackend

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("path", ["trainer_svc/config/__init__.py", "generator_svc/config.py"])
def test_no_frozen_settings_mutated(path: str) -> None:
    assert "object.__setattr__" not in (ROOT / path).read_text()


def test_trainer_backend_derived_and_not_dumped() -> None:
    assert TrainerSettings(model_name="m").backend is TrainingBackend.DTENSOR
    megatron = TrainerSettings(model_name="m", dtensor_cfg={"enabled": False}, megatron_cfg={"enabled": True})
    assert megatron.backend is TrainingBackend.MEGATRON
    assert "backend" not in json.loads(megatron.model_dump_json())
    assert TrainerSettings.model_validate_json(megatron.model_dump_json()) == megatron
    with pytest.raises(ValidationError, match="no training backend enabled"):
        TrainerSettings(model_name="m", dtensor_cfg={"enabled": False})


@pytest.mark.parametrize(("sizes", "executor"), [({}, "uni"), ({"tensor_parallel_size": 2}, "mp"),
                                                 ({"pipeline_parallel_size": 2}, "mp")])
def test_executor_derived_from_workers(sizes: dict, executor: str) -> None:
    assert VllmSettings(**sizes).distributed_executor_backend == executor
    settings = GeneratorSettings.model_validate_json(json.dumps({"model_name": "m", **sizes}))
    assert json.loads(settings.model_dump_json())["distributed_executor_backend"] == executor


def test_uni_refused_for_several_workers() -> None:
    with pytest.raises(ValidationError, match="uni runs one worker"):
        VllmSettings(tensor_parallel_size=2, distributed_executor_backend="uni")


@pytest.mark.parametrize(("fields", "share"), [({}, 0.9), ({"colocated": True}, 0.5),
                                               ({"colocated": "true"}, 0.5),
                                               ({"colocated": True, "gpu_memory_utilization": 0.3}, 0.3)])
def test_gpu_memory_share_derived(fields: dict, share: float) -> None:
    settings = GeneratorSettings(model_name="m", **fields)
    assert settings.gpu_memory_utilization == share
    assert GeneratorSettings.model_validate_json(settings.model_dump_json()).gpu_memory_utilization == share
