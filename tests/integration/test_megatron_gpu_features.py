"""The Megatron options that need GPUs and Transformer Engine, on real torchrun ranks
(`pytest -m gpu tests/integration/test_megatron_gpu_features.py`; deselected by default):

- FP8 (fp8_cfg: e4m3, tensorwise scaling, bf16 compute) on Hopper or newer: the model is built
  on Transformer Engine's layer spec, its logits stay close to HF's and GRPO steps train;
- context parallel 2 (TE ring attention, sequences split in Megatron's load-balanced layout,
  token results gathered back): the same losses, grad norms and logprobs as one rank;
- apply_rope_fusion and bias_activation_fusion pass through (TE spec) with the same losses.

On CPU the same settings are refused at start, naming the key and what is missing
(tests/unit/trainer_svc/test_seed_options.py).
"""

from __future__ import annotations

import pytest
import torch

from coordinator.embedded.tiny_model import ensure_tiny_model
from tests.integration.test_megatron_backend import run_worker

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


def _gpus(n: int, capability: tuple[int, int] = (0, 0)) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices")
    if torch.cuda.get_device_capability() < capability:
        pytest.skip(f"needs compute capability {capability}")
    pytest.importorskip("transformer_engine")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(ensure_tiny_model(tmp_path_factory.mktemp("gpu-model")))


def megatron(model_dir: str, **cfg) -> dict:
    return {"model_name": model_dir, "megatron_cfg": {"enabled": True, **cfg}}


def test_fp8_trains_on_transformer_engine(model_dir, tmp_path):
    _gpus(1, (8, 9))
    cache = tmp_path / "c"
    bf16 = {"optimizer": {"bf16": True}}
    base, _ = run_worker(tmp_path, megatron(model_dir, **bf16), "step2", 1, cache)
    fp8, _ = run_worker(tmp_path, megatron(model_dir, **bf16, fp8_cfg={"enabled": True, "fp8": "e4m3",
                                                                        "fp8_recipe": "tensorwise"}), "step2", 1, cache)
    for mine, ref in zip(fp8["steps"], base["steps"]):
        assert abs(mine["loss"] - ref["loss"]) < 5e-2 and mine["grad_norm"] > 0, (mine, ref)
    for row, ref_row in zip(fp8["logprobs"], base["logprobs"]):
        assert max(abs(a - b) for a, b in zip(row, ref_row)) < 0.25  # FP8 GEMMs: a few % of a logit


def test_context_parallel_2_equals_one_rank(model_dir, tmp_path):
    _gpus(2)
    cache = tmp_path / "c"
    one, _ = run_worker(tmp_path, megatron(model_dir), "step2", 1, cache)
    two, _ = run_worker(tmp_path, megatron(model_dir, context_parallel_size=2), "step2", 2, cache)
    for mine, ref in zip(two["steps"], one["steps"]):
        for key in ("loss", "grad_norm", "kl", "entropy", "num_tokens"):
            assert abs(mine[key] - ref[key]) < 1e-3 * max(1.0, abs(ref[key])), (key, mine, ref)
    for row, ref_row in zip(two["logprobs"], one["logprobs"]):
        assert max(abs(a - b) for a, b in zip(row, ref_row)) < 1e-3


def test_fusions_pass_through_with_the_same_losses(model_dir, tmp_path):
    _gpus(1)
    cache = tmp_path / "c"
    plain, _ = run_worker(tmp_path, megatron(model_dir), "step2", 1, cache)
    fused, _ = run_worker(tmp_path, megatron(model_dir, apply_rope_fusion=True, bias_activation_fusion=True),
                          "step2", 1, cache)
    for mine, ref in zip(fused["steps"], plain["steps"]):
        assert abs(mine["loss"] - ref["loss"]) < 1e-3 and abs(mine["grad_norm"] - ref["grad_norm"]) < 1e-2
