"""GRPO through the real services with the Megatron backend: a torchrun trainer at TP=2,
PP=2 and TP=2 x PP=2 (4 ranks, distributed optimizer), a vLLM generator and a reward
service, started by the same code as `tandem run`. The coordinator does not know which
backend runs; the weights the generator receives are exported from Megatron's shards."""

import math
import os

import pytest
import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.cluster.local import LocalCluster
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.loop.context import LoopContext
from tandem.generation.types import SamplingConfig
from tests import procs
from trainer_svc.types import Sample

pytestmark = pytest.mark.integration

LAYOUTS = {
    "tp2": (2, ["policy.megatron_cfg.tensor_model_parallel_size=2"]),
    "pp2": (2, ["policy.megatron_cfg.pipeline_model_parallel_size=2"]),
    "tp2xpp2-distopt": (4, ["policy.megatron_cfg.tensor_model_parallel_size=2",
                            "policy.megatron_cfg.pipeline_model_parallel_size=2",
                            "policy.megatron_cfg.optimizer.use_distributed_optimizer=true"]),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def loop(request, tmp_path_factory):
    ranks, layout = LAYOUTS[request.param]
    root = tmp_path_factory.mktemp(f"megatron-{request.param}")
    saved = os.environ.get("TANDEM_MEGATRON_CHECKPOINT_DIR")
    os.environ["TANDEM_MEGATRON_CHECKPOINT_DIR"] = str(root / "megatron-cache")
    cfg = load_config(overrides=[
        "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", *layout,
        f"cluster.trainer_ranks={ranks}", "cluster.num_generators=1", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8"])
    model_dir = str(ensure_tiny_model(root / "cache"))
    train_path, _ = ensure_arithmetic_dataset(root / "cache", 0, 500, 16)
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    try:
        with LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log) as services:
            tokens = Tokens(model_dir)
            ctx = LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log)
            yield request.param, ctx
    finally:
        if saved is None:
            os.environ.pop("TANDEM_MEGATRON_CHECKPOINT_DIR", None)
        else:
            os.environ["TANDEM_MEGATRON_CHECKPOINT_DIR"] = saved


def test_grpo_steps_run_on_policy_through_the_services(loop):
    name, ctx = loop
    info = ctx.services.trainer.info()
    assert info.backend == "megatron" and info.world_size == LAYOUTS[name][0]
    sft = [sft_steps(ctx, 2)["loss"] for _ in range(2)]
    assert sft[-1] < sft[0]
    ctx.publish()
    for step in range(1, 4):
        metrics = grpo_step(ctx, step)
        assert metrics["num_samples"] == 16
        assert metrics["weight_version"] == ctx.publisher.version
        # on-policy: the generator's weights are the Megatron model's, so the probabilities agree
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])  # 0 when every group agrees


def test_published_weights_score_like_the_trainer(loop):
    _, ctx = loop
    ctx.publish()
    prompt = ctx.tokens.prompt("37+45=")
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=4, seed=0)
    handle = ctx.generators()[0]
    completion = next(iter(handle.client.generate([prompt], greedy, request_id="check", timeout_s=120)))
    assert completion.weight_version == ctx.publisher.version
    trainer = ctx.services.trainer.logprobs(
        [Sample(token_ids=prompt + list(completion.token_ids), prompt_length=len(prompt))], micro_batch_size=1)[0]
    assert max(abs(a - b) for a, b in zip(trainer, completion.logprobs)) < 1e-4
