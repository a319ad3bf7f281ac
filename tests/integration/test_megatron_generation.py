"""policy.generation.backend: megatron through the real services: a torchrun trainer at TP=2
or PP=2 serves the rollouts from its own Megatron model (no generator service, no weight transfer),
registered as a generator that shares its weights, and GRPO runs on the embedded task.

Checked: every GRPO step gets all its samples and is on-policy; the sampled tokens' logprobs
equal the trainer's ComputeLogprobs (fp32); seeded sampling reproduces; the generation's
weight version follows each publish; and weights a train step moved are not sampled until
they are published."""

import math
from pathlib import Path

import pytest

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.config import load_config
from tandem.generation.types import SamplingConfig
from tandem.rpc import RpcFailure, Status
from trainer_svc.types import Sample

pytestmark = pytest.mark.integration

LAYOUTS = {"tp2": "policy.megatron_cfg.tensor_model_parallel_size=2",  # vocab-parallel logits gathered
           "pp2": "policy.megatron_cfg.pipeline_model_parallel_size=2"}  # logits sent from the last stage
OVERRIDES = [
    "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", "policy.generation.backend=megatron",
    "cluster.trainer_ranks=2", "logger.tensorboard_enabled=false",
    "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8"]


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def ctx(request, tmp_path_factory, start_loop):
    root = tmp_path_factory.mktemp(f"megatron-generation-{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TANDEM_MEGATRON_CHECKPOINT_DIR", str(root / "megatron-cache"))
        cfg = load_config(overrides=[*OVERRIDES, LAYOUTS[request.param], f"logger.log_dir={root}"])
        with start_loop(root, cfg) as (loop, _):
            yield loop


def test_the_trainer_is_the_only_generator(ctx):
    (generator,) = ctx.services.all_generators()
    assert generator.shares_trainer_weights
    info = generator.client.info()
    assert info.engine.startswith("megatron-core") and info.weight_version == 0
    assert ctx.services.trainer.info().world_size == 2


def test_grpo_steps_run_on_policy_with_every_sample(ctx):
    sft = [sft_steps(ctx, 2)["loss"] for _ in range(2)]
    assert sft[-1] < sft[0]
    ctx.publish()
    for step in range(1, 4):
        metrics = grpo_step(ctx, step)
        assert metrics["num_samples"] == 16
        assert metrics["weight_version"] == ctx.publisher.version
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 1e-3, metrics  # same model, same fp32 numbers
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])


def _sample(ctx, seed: int):
    prompts = [ctx.tokens.prompt("37+45="), ctx.tokens.prompt("8+9=")]
    sampling = SamplingConfig(n=4, temperature=1.0, top_p=0.95, max_tokens=4, seed=seed)
    client = ctx.generators()[0].client
    completions = sorted(client.generate(prompts, sampling, request_id="check", timeout_s=120),
                         key=lambda c: (c.prompt_index, c.sample_index))
    return prompts, completions


def test_sampled_logprobs_equal_the_trainers_and_seeds_reproduce(ctx):
    prompts, completions = _sample(ctx, seed=5)
    assert len(completions) == 8 and all(c.weight_version == ctx.publisher.version for c in completions)
    samples = [Sample(prompts[c.prompt_index] + list(c.token_ids), len(prompts[c.prompt_index])) for c in completions]
    trainer = ctx.services.trainer.logprobs(samples, micro_batch_size=8)
    for row, c in zip(trainer, completions):
        assert len(row) == len(c.logprobs) and max(abs(a - b) for a, b in zip(row, c.logprobs)) < 1e-4
    assert [c.token_ids for c in _sample(ctx, seed=5)[1]] == [c.token_ids for c in completions]


def test_the_generation_version_follows_the_publishes(ctx):
    before = ctx.publisher.version
    sft_steps(ctx, 1)  # the weights move past the published version: generating on them is refused
    with pytest.raises(RpcFailure) as refused:
        _sample(ctx, seed=1)
    assert refused.value.status is Status.FAILED_PRECONDITION
    report = ctx.publish()
    assert report.version == before + 1 and report.bytes_sent == 0
    _, completions = _sample(ctx, seed=1)
    assert {c.weight_version for c in completions} == {before + 1}
    assert ctx.generators()[0].client.info().weight_version == before + 1


def test_a_grpo_run_completes_with_the_megatron_recipe(tmp_path, monkeypatch):
    """`tandem run examples/configs/grpo_megatron.yaml` with policy.generation.backend=megatron,
    shortened: SFT warm start, validations, GRPO steps, summary."""
    from coordinator.api import GRPOTrainer

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TANDEM_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "megatron-cache"))
    monkeypatch.delenv("TANDEM_TOKEN", raising=False)
    recipe = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_megatron.yaml"
    summary = GRPOTrainer(recipe, **{
        "policy.generation.backend": "megatron", "logger.log_dir": str(tmp_path / "runs"), "logger.run_name": "mgen",
        "logger.tensorboard_enabled": False, "logger.plot_enabled": False, "checkpointing.enabled": False,
        "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4, "grpo.max_num_steps": 2,
        "grpo.max_val_samples": 16, "policy.train_global_batch_size": 16, "policy.train_micro_batch_size": 16,
        "sft.max_num_steps": 10, "sft.val_period": 10}).train()
    grpo = [row for row in summary["metrics"] if row["phase"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2] and all(r["num_samples"] == 16 for r in grpo)
    assert [r["weight_version"] for r in grpo] == sorted({r["weight_version"] for r in grpo})  # one publish a step
    assert summary["accuracy_before"] is not None and summary["accuracy_after"] is not None
    assert not list((Path(summary["run_dir"]) / "services").glob("generator-*.json"))  # no generator service
    from tests.integration.test_recipes import assert_exported_model_generates

    assert_exported_model_generates(summary)  # the Megatron model exported under HF names
