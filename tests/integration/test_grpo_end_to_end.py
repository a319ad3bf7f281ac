"""The whole loop on real processes on 127.0.0.1: 2 torchrun trainer ranks, 2 vLLM
generators, 1 reward service and the coordinator's membership server, started by the same
code as `tandem run` (LocalCluster). Every test runs in both generation modes: dedicated
(weights over the weight-sync group) and colocated (weights through the host's shared memory)."""

import math

import pytest
import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.config import ConfigError, load_config
from coordinator.data.examples import read_examples
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.loop.context import LoopContext
from coordinator.loop.drift_probe import probe_generators
from coordinator.loop.rollouts import rollout_pipeline
from generator_svc.client import GeneratorClient
from tandem.generation.types import SamplingConfig
from tandem.rpc import RpcFailure, Status
from trainer_svc.client import TrainerClient
from trainer_svc.types import Sample

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["dedicated", "colocated"])
def loop(tmp_path_factory, request, start_loop):
    root = tmp_path_factory.mktemp("e2e")
    cfg = load_config(overrides=[
        "cluster.num_generators=2", "cluster.trainer_ranks=2", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "policy.train_micro_batch_size=32",
        f"policy.generation.colocated.enabled={str(request.param == 'colocated').lower()}"])
    with start_loop(root, cfg, num_train=2000, num_val=64) as (ctx, cluster):
        yield ctx, cluster


def test_every_service_registered(loop):
    ctx, cluster = loop
    kinds = sorted(m.kind for m in cluster.registry.live())
    assert kinds == ["generator", "generator", "reward", "trainer"]
    assert ctx.services.trainer.info().world_size == 2


def test_sft_then_grpo_steps_complete_on_policy(loop):
    ctx, _ = loop
    sft_losses = [sft_steps(ctx, 10)["loss"] for _ in range(3)]
    assert sft_losses[-1] < sft_losses[0]
    ctx.publish()
    for step in range(1, 4):
        metrics = grpo_step(ctx, step)
        assert metrics["num_samples"] == 16 * 8
        assert metrics["weight_version"] == ctx.publisher.version
        assert metrics["generation_weight_version"] == ctx.publisher.version - 1  # sampled with the previous push
        # on-policy: generator and trainer logprobs agree, so the multiplicative error is ~1
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])


def test_async_grpo_trains_off_policy_within_the_age_bound(loop, tmp_path):
    """Async GRPO on the same services: the producer runs a batch ahead, every trained group is at
    most one version old (and some are exactly one: it did overlap), each step records the
    versions, and the importance weights correct the off-policy groups (they move off 1)."""
    ctx, _ = loop
    overrides = ["grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1",
                 "cluster.num_generators=2", "cluster.trainer_ranks=2", "policy.train_micro_batch_size=32",
                 f"policy.generation.colocated.enabled={str(ctx.cfg.policy.generation.colocated.enabled).lower()}"]
    if ctx.cfg.policy.generation.colocated.enabled:
        with pytest.raises(ConfigError, match="colocated.enabled: false"):
            load_config(overrides=overrides)
        return
    cfg = load_config(overrides=overrides)
    examples = read_examples(ensure_arithmetic_dataset(tmp_path, 1, 500, 16)[0], cfg.data, ctx.tokens)
    actx = LoopContext.connect(cfg, ctx.services, ctx.tokens, examples, 0, structlog.get_logger(),
                               versions=ctx.publisher.versions)
    rollouts = rollout_pipeline(actx)
    start = actx.publisher.version
    rollouts.start(1, 4)
    try:
        rows = [grpo_step(actx, step, rollouts) for step in range(1, 5)]
        actx.wait_published()
    finally:
        rollouts.stop()
        # this test's publisher formed its own groups on the shared services: the module's publisher
        # forms a fresh epoch next (its old epoch's rendezvous keys name sockets closed since)
        ctx.publisher.transport.reset()
    for step, m in enumerate(rows, 1):
        assert m["num_samples"] == 16 * 8 and m["stale_groups_dropped"] == 0.0
        assert 0 <= m["trajectory_age_max"] <= 1
        # one version per step, in order, though the publishes are detached (one may be in flight)
        assert m["weight_version"] == start + step
        # sampled by the weights it trains from (start + step - 1) or at most one version older
        assert start + step - 2 <= m["generation_weight_version"] <= start + step - 1, (step, m)
        # the age is counted from the weights the step trains from, published or still in flight
        assert m["trajectory_age_max"] == start + step - 1 - m["generation_weight_version"]
    assert actx.publisher.version == start + 4  # every detached publish arrived
    # the last version went out while nothing trained: what the generators serve is the trainer's
    for r in probe_generators(actx.services, [ctx.tokens.prompt("12+34=")]):
        assert r.weight_version == actx.publisher.version and r.max_abs_diff < 1e-4, r
    off_policy = [m for m in rows if m["trajectory_age_max"] == 1]
    assert off_policy, "the producer never ran ahead"
    assert all(abs(m["importance_weight_mean"] - 1.0) > 1e-4 and m["token_mult_prob_error"] > 1.0 + 1e-4
               for m in off_policy)  # exp(prev - gen) corrects for the weights that moved on


def test_weight_push_reaches_every_generator_exactly(loop):
    ctx, _ = loop
    report = ctx.publish()
    colocated = ctx.cfg.policy.generation.colocated.enabled
    assert (report.epoch == -1) == colocated  # colocated: no weight-sync group was ever formed
    assert report.bytes_sent > 0
    prompt = ctx.tokens.prompt("37+45=")
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=6, seed=0)
    for handle in ctx.generators():
        assert handle.client.info().weight_version == ctx.publisher.version
        completion = next(iter(handle.client.generate([prompt], greedy, request_id="check", timeout_s=60)))
        assert completion.weight_version == ctx.publisher.version
        trainer_lps = ctx.services.trainer.logprobs(
            [Sample(token_ids=prompt + list(completion.token_ids), prompt_length=len(prompt))], micro_batch_size=1)[0]
        assert len(trainer_lps) == len(completion.logprobs)
        assert max(abs(a - b) for a, b in zip(trainer_lps, completion.logprobs)) < 1e-4


def test_calls_without_the_token_are_refused(loop):
    _, cluster = loop
    for member in cluster.registry.live():
        client = {"trainer": TrainerClient, "generator": GeneratorClient}.get(member.kind)
        if client is None:
            continue
        with pytest.raises(RpcFailure) as err:
            client(member.address, None).info()
        assert err.value.status is Status.UNAUTHENTICATED
