"""GRPO through the real services with the Megatron backend: a torchrun trainer at TP=2,
PP=2 and TP=2 x PP=2 (4 ranks, distributed optimizer), a vLLM generator and a reward
service, started by the same code as `tandem run`. The coordinator does not know which
backend runs; the weights the generator receives are exported from Megatron's shards, and the
HF export of the converted checkpoint, before any step, is that checkpoint bit for bit.

Layouts of one world size share a cluster: the next one relaunches only the trainer with its
settings (LocalCluster.restart_trainer, as a relaunch after a crash does) and publishes its
weights to the same generator as the next version."""

import json
import math

import pytest
import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.checkpoint.export import export_hf
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import trainer_settings
from coordinator.loop.context import LoopContext
from tandem.generation.types import SamplingConfig
from tests import procs
from tests.megatron.worker import checkpoint_tensors
from trainer_svc.types import Sample

pytestmark = pytest.mark.integration

LAYOUTS = {
    "pp2": (2, ["policy.megatron_cfg.pipeline_model_parallel_size=2"]),
    "tp2": (2, ["policy.megatron_cfg.tensor_model_parallel_size=2"]),
    "tp2xpp2-distopt": (4, ["policy.megatron_cfg.tensor_model_parallel_size=2",
                            "policy.megatron_cfg.pipeline_model_parallel_size=2",
                            "policy.megatron_cfg.optimizer.use_distributed_optimizer=true"]),
}

EXPECTED = {"pp2": {"tp": 1, "pp": 2, "distopt": False}, "tp2": {"tp": 2, "pp": 1, "distopt": False},
            "tp2xpp2-distopt": {"tp": 2, "pp": 2, "distopt": True}}


class Clusters:
    """One live cluster at a time, kept for the next layout of the same world size."""

    def __init__(self, root):
        self.root, self.log = root, structlog.get_logger()
        self.model_dir = str(ensure_tiny_model(root / "cache"))
        self.train_path, _ = ensure_arithmetic_dataset(root / "cache", 0, 500, 16)
        self.ranks, self.cluster, self.services, self.ctx = 0, None, None, None

    def loop(self, name: str) -> LoopContext:
        ranks, layout = LAYOUTS[name]
        cfg = load_config(overrides=[
            "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", *layout,
            f"cluster.trainer_ranks={ranks}", "cluster.num_generators=1", f"logger.log_dir={self.root}",
            "logger.tensorboard_enabled=false", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
            "policy.train_global_batch_size=16", "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8"])
        tokens = Tokens(self.model_dir)
        examples = read_examples(self.train_path, cfg.data, tokens)
        if ranks == self.ranks:
            run_dir = self.cluster.run_dir
            (run_dir / "services" / "trainer.json").write_text(
                trainer_settings(cfg, self.model_dir).model_dump_json(indent=1))
            self.cluster.restart_trainer()
            version = self.ctx.publisher.version
            self.ctx = LoopContext.connect(cfg, self.services, tokens, examples, 0, self.log)
            self.ctx.publish(version=version + 1)  # the generator serves `version` already
            return self.ctx
        self.close()
        run_dir = self.root / f"run-{name}"
        (run_dir / "logs").mkdir(parents=True)
        self.cluster = LocalCluster(cfg, self.model_dir, run_dir, procs.TOKEN, self.log)
        self.services = self.cluster.__enter__()
        self.ranks = ranks
        self.ctx = LoopContext.connect(cfg, self.services, tokens, examples, 0, self.log)
        return self.ctx

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
            self.cluster, self.ranks = None, 0


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron-grpo")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TANDEM_MEGATRON_CHECKPOINT_DIR", str(root / "megatron-cache"))
        made = Clusters(root)
        try:
            yield made
        finally:
            made.close()


@pytest.fixture(scope="module", params=list(LAYOUTS))  # in this order: the 2-rank layouts one after the other
def loop(request, clusters):
    ctx = clusters.loop(request.param)
    return request.param, ctx, clusters.cluster.run_dir


def _trainer_layout(run_dir) -> dict:
    """The Megatron settings the live trainer started with (its last `settings` line)."""
    lines = [json.loads(line) for line in (run_dir / "logs" / "trainer.log").read_text().splitlines()
             if line.startswith("{") and '"event": "settings"' in line]
    cfg = lines[-1]["megatron_cfg"]
    return {"tp": cfg["tensor_model_parallel_size"], "pp": cfg["pipeline_model_parallel_size"],
            "distopt": cfg["optimizer"]["use_distributed_optimizer"]}


def test_the_export_before_any_step_is_the_checkpoint_exactly(loop, clusters, tmp_path):
    """ExportHf from Megatron's shards (TP and PP gathers, the distributed optimizer's layout), as
    every run's end does it, of the weights just converted from the HF checkpoint: bit-equal."""
    _, ctx, _ = loop
    export = export_hf(ctx.services.trainer, tmp_path / "hf", ctx.log)
    exported, source = checkpoint_tensors(export.path), checkpoint_tensors(clusters.model_dir)
    assert sorted(exported) == sorted(source)
    assert max((exported[n] - source[n]).abs().max().item() for n in source) == 0.0


def test_grpo_steps_run_on_policy_through_the_services(loop):
    name, ctx, run_dir = loop
    info = ctx.services.trainer.info()
    assert info.backend == "megatron" and info.world_size == LAYOUTS[name][0]
    assert _trainer_layout(run_dir) == EXPECTED[name]  # a relaunched trainer runs the new layout
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
    _, ctx, _ = loop
    ctx.publish()
    prompt = ctx.tokens.prompt("37+45=")
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=4, seed=0)
    handle = ctx.generators()[0]
    completion = next(iter(handle.client.generate([prompt], greedy, request_id="check", timeout_s=120)))
    assert completion.weight_version == ctx.publisher.version
    trainer = ctx.services.trainer.logprobs(
        [Sample(token_ids=prompt + list(completion.token_ids), prompt_length=len(prompt))], micro_batch_size=1)[0]
    assert max(abs(a - b) for a, b in zip(trainer, completion.logprobs)) < 1e-4
