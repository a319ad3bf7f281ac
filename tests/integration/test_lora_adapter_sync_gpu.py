"""LoRA adapter-only weight sync on a one-GPU node (marked `gpu`: deselected by default, skipped
without a CUDA device). The dedicated generator shares the trainer's GPU, so each version's
adapters travel by CUDA IPC (tandem.colocation) and vLLM serves them over the base weights it
loaded at start (generator_svc/engines/served_weights.py); GRPO steps stay on-policy and each
publish is the adapters' size, not the model's. The CPU path runs in tests/integration/test_recipes.py."""

import math

import pytest
import torch

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from tandem.colocation import WeightTransport

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def loop(tmp_path_factory, start_loop):
    root = tmp_path_factory.mktemp("lora-adapter-gpu")
    cfg = load_config(overrides=[
        "cluster.gpus_per_node=1", "cluster.num_generators=1", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "policy.train_micro_batch_size=32", "policy.optimizer.kwargs.lr=0.05",
        "policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.weight_sync=adapter"])
    assert cfg.generators_serve_adapters
    with start_loop(root, cfg, num_train=2000, num_val=64) as (ctx, _):
        yield ctx


def test_adapters_reach_a_generator_on_the_trainers_gpu_and_are_served_on_policy(loop):
    assert loop.services.trainer.info().device_type == "cuda"
    assert loop.phases.colocation.transport is WeightTransport.CUDA_IPC
    loop.publish()
    for step in range(1, 4):
        metrics = grpo_step(loop, step)
        assert metrics["weight_version"] == loop.publisher.version
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"])
    info = loop.services.trainer.info()
    assert all(".lora_" in t.name for t in info.bucket_plan.tensors)  # the adapters, not the model
    assert info.bucket_plan.total_bytes < info.num_parameters * 4 / 5
