"""Generators that die and join mid-run, on real processes (LocalCluster: 1 trainer rank,
2 vLLM generators, 1 reward service):

- kill -9 of a generator's process group while a GRPO step's rollout is in flight: the step
  still returns every sample, the publish after it forms a new epoch without the dead one,
  and the next step works;
- a generator started mid-run is brought to the current weights before it gets any work;
- a generator killed just as a publish reaches it: the publish is retried on a new epoch
  with the survivor.
Prints the measured detection and re-form times (pytest -s shows them).
"""

import os
import signal
import threading
import time

import pytest

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.launch.launcher import ServiceSpec, python_module
from coordinator.launch.specs import generator_settings, scratch_root
from tandem.generation.types import SamplingConfig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def loop(tmp_path_factory, start_loop):
    root = tmp_path_factory.mktemp("failover")
    cfg = load_config(overrides=[
        "cluster.num_generators=2", "cluster.trainer_ranks=1", f"logger.log_dir={root}", "grpo.num_prompts_per_step=16",
        "logger.tensorboard_enabled=false", "cluster.max_service_restarts=0",  # the survivors take the work
    ])
    with start_loop(root, cfg, op_timeout_s=10.0) as (ctx, cluster):
        yield ctx, cluster


def _member(cluster, member_id):
    return next(m for m in cluster.registry.live("generator") if m.member_id == member_id)


def _watch_failures(services) -> list[tuple[str, float]]:
    """Record when the rollout reports a generator failed (the instance attribute shadows the method)."""
    seen: list[tuple[str, float]] = []
    original = services.generator_failed

    def record(handle, exc):
        seen.append((handle.member_id, time.monotonic()))
        original(handle, exc)

    services.generator_failed = record
    return seen


def test_kill_9_mid_rollout_loses_no_sample_and_the_next_publish_reforms(loop):
    ctx, cluster = loop
    services = ctx.services
    ctx.publish()
    first_epoch, version = ctx.publisher.epoch, ctx.publisher.version
    victim = ctx.generators()[1]  # holds prompts 8..15 of the step
    pid = _member(cluster, victim.member_id).pid
    killed: list[float] = []
    armed = [True]
    generate = victim.client.generate

    def die_with_the_request_in_flight(*args, **kwargs):
        # Freeze the victim so its share cannot finish, send the request, then kill -9 it while
        # the stream is open: the rollout is mid-flight however fast the tiny model generates.
        # Once: a later call (there should be none) meets the dead process as it is.
        if not armed:
            yield from generate(*args, **kwargs)
            return
        armed.clear()
        os.killpg(pid, signal.SIGSTOP)

        def kill():
            os.killpg(pid, signal.SIGKILL)
            killed.append(time.monotonic())

        threading.Timer(0.5, kill).start()
        yield from generate(*args, **kwargs)

    victim.client.generate = die_with_the_request_in_flight
    failures = _watch_failures(services)
    try:
        metrics = grpo_step(ctx, 1)
    finally:
        del victim.client.generate  # the instance attribute shadowed the method
    assert killed, "the victim was never asked to generate"
    assert [m for m, _ in failures] == [victim.member_id], "the kill did not land mid-rollout"
    assert metrics["num_samples"] == 16 * 8
    assert metrics["generation_weight_version"] == version  # every sample from the published version
    assert ctx.publisher.epoch == first_epoch + 1 and metrics["weight_version"] == version + 1
    assert [g.member_id for g in services.all_generators()] != [victim.member_id]
    assert len(services.all_generators()) == 1
    print(f"\nkill -9 mid-rollout: detected after {failures[0][1] - killed[0]:.3f}s")
    metrics = grpo_step(ctx, 2)
    assert metrics["num_samples"] == 16 * 8 and metrics["weight_version"] == version + 2


def test_a_generator_started_mid_run_gets_the_current_weights_before_work(loop):
    ctx, cluster = loop
    cfg, services = ctx.cfg, ctx.services
    run_dir = cluster.run_dir
    settings = generator_settings(cfg, cluster.model_dir, 2, scratch_root(run_dir) / "generator-2")
    path = run_dir / "services" / "generator-2.json"
    path.write_text(settings.model_dump_json())
    cluster.launcher.start(ServiceSpec("generator-2", python_module(
        "generator_svc", "--settings", str(path), "--host", cfg.cluster.host, "--coordinator", cluster.address)))
    cluster.registry.wait_for(lambda ms: sum(m.kind == "generator" for m in ms) >= 2, 300)
    old, new = sorted(services.all_generators(), key=lambda g: not ctx.publisher.versions.is_current(g.member_id))
    assert not ctx.publisher.versions.is_current(new.member_id) and new.client.info().weight_version == 0
    ready = ctx.generators()  # brings the newcomer up to date first
    assert {g.member_id for g in ready} == {old.member_id, new.member_id}
    assert new.client.info().weight_version == ctx.publisher.version
    prompt = ctx.tokens.prompt("37+45=")
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=6, seed=0)
    a, b = (next(iter(g.client.generate([prompt], greedy, timeout_s=60))) for g in (old, new))
    assert a.token_ids == b.token_ids and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    assert grpo_step(ctx, 3)["num_samples"] == 16 * 8


def test_a_publish_that_fails_part_way_is_retried_without_the_dead(loop):
    ctx, cluster = loop
    services = ctx.services
    generators = services.all_generators()
    assert len(generators) == 2
    victim = generators[-1]
    pid = _member(cluster, victim.member_id).pid
    receive = victim.client.load_weights

    def die_on_receive(*args, **kwargs):  # the receiver dies as the broadcast starts
        os.killpg(pid, signal.SIGKILL)
        return receive(*args, **kwargs)

    victim.client.load_weights = die_on_receive
    epoch, version = ctx.publisher.epoch, ctx.publisher.version
    started = time.monotonic()
    report = ctx.publish()
    print(f"\npublish with a receiver killed: {time.monotonic() - started:.2f}s in all, "
          f"{report.attempts} attempts, retry on epoch {report.epoch} took {report.duration_s:.3f}s")
    assert report.attempts == 2 and report.num_generators == 1 and report.version == version + 1
    assert report.epoch == epoch + 1  # the failed attempt reused the current group; the retry forms a new one
    assert victim.member_id not in {g.member_id for g in services.all_generators()}
    survivor = ctx.generators()
    assert len(survivor) == 1 and survivor[0].client.info().weight_version == report.version
    assert grpo_step(ctx, 4)["num_samples"] == 16 * 8
