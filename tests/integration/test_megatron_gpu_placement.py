"""The Megatron backend on a CUDA device, local layer spec (issue 27 defects 1 and 2;
`pytest -m gpu tests/integration/test_megatron_gpu_placement.py`, deselected by default):

- one rank: the model is built on the GPU and moved to the current device before Megatron's DDP
  allocates its grad buffers there; two GRPO steps give the CPU run's losses and grad norms;
- TP=2 with sequence parallelism (2 GPUs): the torch norm is built under SP and trains like one rank.

The decisions themselves are tested on CPU: tests/unit/trainer_svc/test_megatron_placement.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from coordinator.embedded.tiny_model import ensure_tiny_model
from tests.integration.test_megatron_backend import megatron, run_worker

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


def _gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(ensure_tiny_model(tmp_path_factory.mktemp("gpu-placement-model")))


def _close(mine: list[dict], ref: list[dict], keys=("loss", "grad_norm", "num_tokens")) -> None:
    for a, b in zip(mine, ref, strict=True):
        for key in keys:
            assert math.isfinite(a[key]) and abs(a[key] - b[key]) < 2e-3 * max(1.0, abs(b[key])), (key, a, b)


def test_one_rank_step_on_cuda_matches_cpu(model_dir, tmp_path):
    _gpus(1)
    cache = tmp_path / "c"
    gpu, log = run_worker(tmp_path, megatron(model_dir), "step2", 1, cache)
    cpu, _ = run_worker(tmp_path, megatron(model_dir), "step2", 1, cache, extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert gpu["steps"][0]["grad_norm"] > 0, log[-3000:]
    _close(gpu["steps"], cpu["steps"])


def test_tp2_sequence_parallel_on_cuda_matches_one_rank(model_dir, tmp_path):
    _gpus(2)
    cache = tmp_path / "c"
    one, _ = run_worker(tmp_path, megatron(model_dir), "step2", 1, cache)
    two, _ = run_worker(tmp_path, megatron(model_dir, tensor_model_parallel_size=2, sequence_parallel=True),
                          "step2", 2, cache)
    _close(two["steps"], one["steps"])
