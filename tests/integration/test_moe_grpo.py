"""The MoE recipe (examples/configs/grpo_moe_megatron.yaml) through the real services: a
torchrun Megatron trainer at expert parallel 2 (2 ranks: experts 0-1 on rank 0, 2-3 on rank 1)
on a tiny Qwen2-MoE, one vLLM generator running that model with tensor parallel 2 (vLLM's mp executor: two worker
processes, the first receives each version over the weight-sync group and fans it out to the
second, generator_svc/fanout.py) and a reward service, started by the same code as `tandem run`.

The generator's weights after every publish are the trainer's (gathered over EP), so the
sampled tokens' probabilities agree (token_mult_prob_error ~ 1) and a greedy completion's
logprobs equal the trainer's; the routers' load-balancing loss is reported every step.
Router replay is on (the recipe's policy.router_replay): every completion carries the experts vLLM's routers
chose for it (generator_svc/route_capture.py, through both TP workers), the trainer replays
them, and its own routers agree on every one (decisive routing); a sample whose routes are
moved is scored with the moved experts.
TP=2 x EP=2 needs 4 trainer ranks beside 2 vLLM workers on the 2 cores CI has: its numbers are
checked without services in tests/integration/test_megatron_moe.py.
"""

import math
import os
from pathlib import Path

import pytest
import torch

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.config import load_config
from coordinator.embedded.tiny_moe import TinyMoeSpec, ensure_tiny_moe
from tandem.generation.types import SamplingConfig
from trainer_svc.types import Sample

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_moe_megatron.yaml"


@pytest.fixture(scope="module")
def loop(tmp_path_factory, start_loop):
    root = tmp_path_factory.mktemp("moe-grpo")
    saved = os.environ.get("TANDEM_MEGATRON_CHECKPOINT_DIR")
    os.environ["TANDEM_MEGATRON_CHECKPOINT_DIR"] = str(root / "megatron-cache")
    # the recipe as `tandem run` reads it (examples/configs/grpo_moe_megatron.yaml), sizes shortened
    # and the generator's vLLM at tensor parallel 2
    cfg = load_config(RECIPE, overrides=[
        "policy.generation.vllm_cfg.tensor_parallel_size=2", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8"])
    assert cfg.policy.router_replay.enabled  # the recipe's
    # N(0, 0.1) weights: decisive routing, so vLLM's and Megatron's top-k pick the same experts
    model_dir = str(ensure_tiny_moe(root / "cache", TinyMoeSpec(init_std=0.1)))
    try:
        with start_loop(root, cfg, model_dir=model_dir) as (ctx, _):
            yield ctx
    finally:
        if saved is None:
            os.environ.pop("TANDEM_MEGATRON_CHECKPOINT_DIR", None)
        else:
            os.environ["TANDEM_MEGATRON_CHECKPOINT_DIR"] = saved


def test_grpo_steps_on_policy_at_ep2_with_a_tp2_generator(loop):
    ctx = loop
    info = ctx.services.trainer.info()
    assert info.backend == "megatron" and info.world_size == 2
    assert any(".mlp.experts.3.down_proj.weight" in t.name for t in info.bucket_plan.tensors)  # EP rank 1's expert
    sft = [sft_steps(ctx, 2)["loss"] for _ in range(2)]
    assert sft[-1] < sft[0]
    ctx.publish()
    for step in range(1, 3):
        metrics = grpo_step(ctx, step)
        assert metrics["num_samples"] == 16 and metrics["weight_version"] == ctx.publisher.version
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics  # the generator samples the trainer's model
        assert metrics["moe_load_balancing_loss"] >= 1.0 and math.isfinite(metrics["grad_norm"])
        # every sample's routes replayed: prompt (>= 4 tokens) + completion - 1 rows, 2 MoE layers each
        assert metrics["moe_router_replay_rows"] >= 16 * 4 * 2, metrics
        assert metrics["moe_router_replay_disagreement"] == 0.0, metrics  # the trainer's routers chose the same


def test_published_moe_weights_score_like_the_trainer(loop):
    ctx = loop
    ctx.publish()
    prompt = ctx.tokens.prompt("37+45=")
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=4, seed=0)
    completion = next(iter(ctx.generators()[0].client.generate([prompt], greedy, request_id="check", timeout_s=120)))
    assert completion.weight_version == ctx.publisher.version
    ids = prompt + list(completion.token_ids)
    assert len(completion.routed_experts) == (len(ids) - 1) * 2 * 2  # every fed token x 2 layers x top-2
    routes = torch.tensor(completion.routed_experts).view(len(ids) - 1, 2, 2)
    moved = routes.clone()
    moved[len(prompt) - 1:, -1] = (moved[len(prompt) - 1:, -1] + 1) % 4  # the completion's last-layer experts
    trainer, replayed, other = ctx.services.trainer.logprobs(
        [Sample(token_ids=ids, prompt_length=len(prompt)),
         Sample(token_ids=ids, prompt_length=len(prompt), routed_experts=completion.routed_experts),
         Sample(token_ids=ids, prompt_length=len(prompt), routed_experts=moved.flatten().tolist())],
        micro_batch_size=1)
    assert max(abs(a - b) for a, b in zip(trainer, completion.logprobs)) < 1e-4
    assert replayed == trainer  # vLLM's routes are the trainer's own
    assert max(abs(a - b) for a, b in zip(other, trainer)) > 1e-2  # moved routes: the trainer took them
