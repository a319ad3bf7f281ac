"""Dedicated generation on a one-GPU node (marked `gpu`: deselected by default, skipped without a
CUDA device). The placement (coordinator/config/placement.py) puts the trainer (1 rank) and the
dedicated generator on GPU 0: weights go by CUDA IPC (NCCL refuses two ranks on one device), the
generator never sleeps and takes half the device; a GRPO step completes on-policy."""

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
from coordinator.launch.specs import gpu_memory_utilization
from coordinator.loop.context import LoopContext
from tandem.colocation import WeightTransport
from tests import procs

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-gpu-dedicated")
    cfg = load_config(overrides=[
        "cluster.gpus_per_node=1", "cluster.num_generators=1", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "policy.train_micro_batch_size=32"])
    assert cfg.placement.trainer_env() == cfg.placement.generator_env(0) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert gpu_memory_utilization(cfg) == 0.5
    model_dir = str(ensure_tiny_model(root / "cache"))
    train_path, _ = ensure_arithmetic_dataset(root / "cache", 0, 2000, 64)
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    with LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log) as services:
        tokens = Tokens(model_dir)
        yield LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log)


def test_one_gpu_dedicated_passes_weights_by_cuda_ipc_without_sleeping(loop):
    assert loop.services.trainer.info().device_type == "cuda"
    assert loop.phases.colocation.transport is WeightTransport.CUDA_IPC and not loop.phases.colocation.sleeps
    loop.publish()
    for step in range(1, 3):
        metrics = grpo_step(loop, step)
        assert metrics["weight_version"] == loop.publisher.version
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"])
    assert loop.phases.asleep == []
