"""LoRA adapter-only weight sync on a one-GPU node (marked `gpu`: deselected by default, skipped
without a CUDA device). The dedicated generator shares the trainer's GPU, so each version's
adapters travel by CUDA IPC (tandem.colocation) and vLLM serves them over the base weights it
loaded at start (generator_svc/engines/served_weights.py); GRPO steps stay on-policy and each
publish is the adapters' size, not the model's. The CPU path runs in tests/integration/test_recipes.py."""

import math

import pytest
import structlog
import torch

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.local import LocalCluster
from coordinator.loop.context import LoopContext
from tandem.colocation import WeightTransport
from tests import procs

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-adapter-gpu")
    cfg = load_config(overrides=[
        "cluster.gpus_per_node=1", "cluster.num_generators=1", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "policy.train_micro_batch_size=32", "policy.optimizer.kwargs.lr=0.05",
        "policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.weight_sync=adapter"])
    assert cfg.generators_serve_adapters
    model_dir = str(ensure_tiny_model(root / "cache"))
    train_path, _ = ensure_arithmetic_dataset(root / "cache", 0, 2000, 64)
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    with LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log) as services:
        tokens = Tokens(model_dir)
        yield LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log)


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
