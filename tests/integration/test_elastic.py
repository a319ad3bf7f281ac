"""Generators that come and go during one run, on real processes (LocalCluster: 1 trainer rank,
vLLM generators, 1 reward service), in one flow that shares the cluster:

1. 1 -> 3: two generators join mid-run; each gets the current weights, then work.
2. kill -9 of a random generator mid-step, repeated (TANDEM_FAULT_KILLS, default 6), a
   replacement spawned after each kill so the pool never runs dry: the kill lands the moment
   the victim's first completion of the step reaches the coordinator (or after the step if it
   got no work), every step returns all its samples, and every sample comes from the version
   published before the step (no generator serves stale or unannounced weights).
3. 3 -> 1: SIGTERM to the main process of all generators but one the moment each has
   streamed its first completion of the step (a SIGTERM to a generator's whole process group
   also stops vLLM's engine processes at once: no drain then, its prompts are re-sent): they
   finish their calls (nothing re-sent), leave, exit 0, and get no work after they announced
   leaving.
4. The run ends with the expected steps and samples.
Prints the measured detection, re-form and spawn times (pytest -s shows them).
"""

import os
import random
import signal
import threading
import time

import pytest
import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.launcher import ServiceSpec, python_module
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import generator_settings, scratch_root
from coordinator.loop.context import LoopContext
from generator_svc.client import GeneratorClient
from tests import procs

pytestmark = pytest.mark.integration

SAMPLES = 16 * 8
KILLS = int(os.environ.get("TANDEM_FAULT_KILLS", "6"))  # each kill starts a replacement vLLM


class Recorder:
    """Every Generate call the coordinator makes: (address, start time, versions of its completions).

    `on_first(address)`, when set, runs in the rollout's thread as a call's first completion
    arrives, before the rollout sees it: the generator is then certainly serving that call.
    """

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, float, list[int]]] = []
        self.expected: dict[int, int] = {}  # id(versions) -> completions the call asked for
        self.on_first = None
        original = GeneratorClient.generate

        def generate(client, prompts, sampling, *args, **kwargs):
            versions: list[int] = []
            self.calls.append((client.address, time.monotonic(), versions))
            self.expected[id(versions)] = len(prompts) * sampling.n
            for completion in original(client, prompts, sampling, *args, **kwargs):
                if not versions and self.on_first is not None:
                    self.on_first(client.address)
                versions.append(completion.weight_version)
                yield completion

        monkeypatch.setattr(GeneratorClient, "generate", generate)

    def since(self, start: float) -> list[tuple[str, float, list[int]]]:
        return [c for c in self.calls if c[1] >= start]

    def complete(self, call: tuple[str, float, list[int]]) -> bool:
        """Whether the call streamed every completion it asked for."""
        return len(call[2]) == self.expected[id(call[2])]


class Pool:
    """Spawns generators into the cluster by name."""

    def __init__(self, ctx, cluster):
        self.ctx, self.cluster, self.count, self.spawned_at = ctx, cluster, 1, {}

    def spawn(self) -> str:
        cfg, name = self.ctx.cfg, f"generator-{self.count}"
        settings = generator_settings(cfg, self.cluster.model_dir, self.count, scratch_root(self.cluster.run_dir) / name)
        path = self.cluster.run_dir / "services" / f"{name}.json"
        path.write_text(settings.model_dump_json())
        self.cluster.launcher.start(ServiceSpec(name, python_module(
            "generator_svc", "--settings", str(path), "--host", cfg.cluster.host, "--coordinator",
            self.cluster.address), essential=False))
        self.count += 1
        self.spawned_at[self.cluster.launcher.pids()[name]] = time.monotonic()
        return name

    def wait_live(self, n: int, timeout_s: float = 400) -> list:
        members = self.cluster.registry.wait_for(lambda ms: sum(m.kind == "generator" for m in ms) >= n, timeout_s)
        return [m for m in members if m.kind == "generator"]


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    cfg = load_config(overrides=[
        "cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={root}", "grpo.num_prompts_per_step=16",
        "cluster.max_service_restarts=0",  # the test replaces the generators it kills itself
        "logger.tensorboard_enabled=false", "policy.generation.max_new_tokens=24"])  # a kill lands mid-rollout
    model_dir = str(ensure_tiny_model(root / "cache"))
    train_path, _ = ensure_arithmetic_dataset(root / "cache", 0, 500, 16)
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    cluster = LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log)
    with cluster as services:
        tokens = Tokens(model_dir)
        ctx = LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log,
                                  op_timeout_s=10.0)
        yield ctx, cluster, Pool(ctx, cluster), {"steps": 0, "samples": 0}


def _step(ctx, totals) -> dict:
    totals["steps"] += 1
    metrics = grpo_step(ctx, totals["steps"])
    totals["samples"] += int(metrics["num_samples"])
    assert metrics["num_samples"] == SAMPLES
    return metrics


def _versions_of(calls) -> set[int]:
    return {v for _, _, versions in calls for v in versions}


def test_generators_joining_mid_run_get_the_weights_then_work(flow, monkeypatch):
    ctx, cluster, pool, totals = flow
    recorder = Recorder(monkeypatch)
    ctx.publish()
    _step(ctx, totals)
    names = [pool.spawn(), pool.spawn()]
    members = pool.wait_live(3)
    assert len(members) == 3 and names == ["generator-1", "generator-2"]
    version = ctx.publisher.version
    started = time.monotonic()
    _step(ctx, totals)
    calls = recorder.since(started)
    assert {address for address, _, _ in calls} == {m.address for m in members}  # all three got work
    assert _versions_of(calls) == {version}  # ... and all of it on the current weights
    for g in ctx.services.all_generators():
        assert g.client.info().weight_version == ctx.publisher.version


class Killer:
    """kill -9 of one generator's process group when its first completion of the step arrives."""

    def __init__(self, address: str, pid: int):
        self.address, self.pid, self.at, self.mid_step = address, pid, None, False
        self._lock = threading.Lock()

    def on_first(self, address: str) -> None:
        if address == self.address:
            self.kill(mid_step=True)

    def kill(self, *, mid_step: bool) -> None:
        with self._lock:
            if self.at is None:
                os.killpg(self.pid, signal.SIGKILL)
                self.at, self.mid_step = time.monotonic(), mid_step


@pytest.mark.timeout(2400)  # bounded by vLLM start-ups (a replacement per kill): minutes on a busy box
def test_repeated_kill_9_of_a_random_generator_mid_step(flow, monkeypatch):
    ctx, cluster, pool, totals = flow
    recorder = Recorder(monkeypatch)
    rng = random.Random(5)
    detections, mid_rollout, reforms = [], 0, []
    failures: list[tuple[str, float]] = []
    original = ctx.services.generator_failed
    ctx.services.generator_failed = lambda h, e: (failures.append((h.member_id, time.monotonic())), original(h, e))
    for kill in range(KILLS):
        pool.wait_live(2)
        admitted = ctx.generators()  # brings newcomers up to date first
        assert len(admitted) >= 2
        victim = rng.choice(admitted)
        pid = next(m.pid for m in cluster.registry.live("generator") if m.member_id == victim.member_id)
        version, epoch = ctx.publisher.version, ctx.publisher.epoch
        killer = Killer(victim.client.address, pid)
        recorder.on_first = killer.on_first
        started = time.monotonic()
        metrics = _step(ctx, totals)
        recorder.on_first = None
        killer.kill(mid_step=False)  # it got no work this step: it dies between steps instead
        pool.spawn()  # keep the pool from running dry
        assert _versions_of(recorder.since(started)) == {version}, f"kill {kill}: a sample from other weights"
        assert metrics["generation_weight_version"] == version and metrics["weight_version"] == version + 1
        if not killer.mid_step:  # membership drops it once its heartbeats stop
            cluster.registry.wait_for(lambda ms: victim.member_id not in {m.member_id for m in ms}, 60)
        assert victim.member_id not in {g.member_id for g in ctx.services.all_generators()}
        lost = [t for m, t in failures if m == victim.member_id]
        if lost:
            mid_rollout += 1
            detections.append(lost[0] - killer.at)
        elif killer.mid_step:  # its whole share had already been streamed: nothing to re-send
            mine = [c for c in recorder.since(started) if c[0] == victim.client.address]
            assert mine and all(recorder.complete(c) for c in mine), \
                f"kill {kill}: the rollout did not notice the dead generator"
        if ctx.publisher.epoch > epoch:
            reforms.append(metrics["time_publish_s"])
        for g in ctx.services.all_generators():  # every generator in rotation serves the announced version
            if ctx.publisher.versions.is_current(g.member_id):
                assert g.client.info().weight_version == ctx.publisher.version
    assert mid_rollout >= KILLS // 2, f"only {mid_rollout} of {KILLS} kills landed mid-rollout"
    print(f"\n{KILLS} kills ({mid_rollout} mid-rollout): detection {min(detections):.3f}-{max(detections):.3f}s "
          f"(median {sorted(detections)[len(detections) // 2]:.3f}s); publish on a re-formed group "
          f"{min(reforms, default=0):.3f}-{max(reforms, default=0):.3f}s")


def test_sigterm_drains_generators_down_to_one(flow, monkeypatch):
    ctx, cluster, pool, totals = flow
    recorder = Recorder(monkeypatch)
    pool.wait_live(3)
    admitted = ctx.generators()
    keep, leaving = admitted[0], admitted[1:]
    members = {m.member_id: m for m in cluster.registry.live("generator")}
    names = {pid: name for name, pid in cluster.launcher.pids().items()}
    left_at: dict[str, float] = {}
    deregister = cluster.registry.deregister

    def record(member_id, *, draining=False):
        left_at.setdefault(member_id, time.monotonic())
        deregister(member_id, draining=draining)

    cluster.registry.deregister = record
    failures = []
    original = ctx.services.generator_failed
    ctx.services.generator_failed = lambda h, e: (failures.append(h.member_id), original(h, e))
    signalled: list[str] = []
    by_address = {g.client.address: g.member_id for g in leaving}

    def stop(address: str) -> None:  # its main process, as `docker stop` does
        member_id = by_address.get(address)
        if member_id is not None and member_id not in signalled:
            signalled.append(member_id)
            os.kill(members[member_id].pid, signal.SIGTERM)

    recorder.on_first = stop
    started = time.monotonic()
    metrics = _step(ctx, totals)
    recorder.on_first = None
    assert sorted(signalled) == sorted(g.member_id for g in leaving), "a generator never got work to drain"
    assert failures == []  # drained, not failed: nothing was re-sent
    for g in leaving:
        assert cluster.launcher.wait_exit(names[members[g.member_id].pid], 120) == 0  # a clean exit after draining
        after = [c for c in recorder.since(left_at[g.member_id]) if c[0] == members[g.member_id].address]
        assert after == [], "work was sent to a generator after it announced leaving"
        assert any(c[0] == members[g.member_id].address for c in recorder.since(started))  # it did work
    assert [g.member_id for g in ctx.services.all_generators()] == [keep.member_id]
    assert metrics["weight_version"] == ctx.publisher.version
    _step(ctx, totals)  # one generator left: the run goes on
    assert totals["steps"] == KILLS + 4 and totals["samples"] == totals["steps"] * SAMPLES
