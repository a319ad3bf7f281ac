"""The step's sequencing by colocation, against fake trainer and generators (no sockets, no GPU):
colocated on GPUs the generators sleep after the rollouts, the trainer trains, weights wake, the
version passes by CUDA IPC (exported, read, released), then the KV cache wakes; a generator never
generates while anything of it sleeps. On CPU (shared memory) and with dedicated generators
nothing sleeps. Also the config checks of the generators' GPU memory share."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog
import torch

from coordinator.algorithms import grpo as grpo_module
from coordinator.config import ConfigError, load_config
from coordinator.data.examples import Example
from coordinator.launch.specs import generator_settings
from coordinator.loop import rollouts as rollouts_module
from coordinator.loop.context import LoopContext
from coordinator.loop.multiturn import Episode
from coordinator.membership.services import GeneratorHandle
from tandem.colocation import FREE_WEIGHTS_LEVEL
from tandem.generation.types import GeneratorInfo
from tandem.rpc import RpcFailure, Status
from tandem.weight_source import CollectiveSource, CudaIpcSource, SharedMemorySource
from tandem.weight_sync import make_bucket_plan
from trainer_svc.types import CudaIpcExport, PublishResult, StepResult

PLAN = make_bucket_plan([("w", (4,), torch.float32)])


class FakeTrainer:
    def __init__(self, events, device_type):
        self.events, self.device_type, self.step = events, device_type, 0

    def info(self):
        return SimpleNamespace(weight_sync_store_address="127.0.0.1:1", bucket_plan=PLAN,
                               device_type=self.device_type, global_step=self.step)

    def train_step(self, samples, loss, *, global_batch_size, micro_batch_size, learning_rate=None):
        self.events.append(("trainer", "train"))
        self.step += 1
        return StepResult({"loss": 0.0}, self.step)

    def export_cuda_ipc(self, version):
        self.events.append(("trainer", "export", version))
        return CudaIpcExport(version, (b"handle",), PLAN.total_bytes, 1)

    def release_cuda_ipc(self, version):
        self.events.append(("trainer", "release", version))
        return True

    def export_hf(self, path, for_generators=False):
        Path(path).mkdir(parents=True)
        (Path(path) / "model.safetensors").write_bytes(b"x")
        self.events.append(("trainer", "export_hf"))
        return 1

    def publish_weights(self, group, version, detach=False):
        self.events.append(("trainer", "broadcast", version))
        return PublishResult(16, 1)


def Dead() -> RpcFailure:
    return RpcFailure(Status.UNAVAILABLE, "gone")


class FakeGenerator:
    """A generator client that refuses, like the real engine, to generate while asleep."""

    def __init__(self, name, events, dies_on_sleep=False, refuses_sleep=False):
        self.name, self.events, self.asleep, self.version = name, events, set(), 0
        self.dies_on_sleep, self.refuses_sleep, self.freed = dies_on_sleep, refuses_sleep, False

    def info(self, timeout_s=0):
        return GeneratorInfo("m", self.version, "fake", "float32", 8, 0, tuple(sorted(self.asleep)))

    def generate(self, prompts, sampling, request_id="", timeout_s=0):
        assert not self.asleep, f"{self.name} asked to generate while {self.asleep} sleep"
        assert not self.freed, f"{self.name} asked to generate with its weights freed"
        self.events.append((self.name, "generate"))
        return iter(())

    def sleep(self, level=1, timeout_s=0):
        if self.dies_on_sleep:
            raise Dead()
        if self.refuses_sleep:
            raise RpcFailure(Status.FAILED_PRECONDITION, "nothing to sleep")
        self.events.append((self.name, "sleep", level))
        if level == FREE_WEIGHTS_LEVEL:  # a CPU generator frees its weights: nothing asleep, no version served
            self.freed = True
            return ()
        self.asleep = {"weights", "kv_cache"}
        return tuple(sorted(self.asleep))

    def wake_up(self, memory=None, timeout_s=0):
        self.events.append((self.name, "wake", *memory))
        self.asleep -= set(memory)
        return tuple(sorted(self.asleep))

    def load_weights(self, source, version, timeout_s=0):
        kinds = {CudaIpcSource: "load_ipc", SharedMemorySource: "load_shared", CollectiveSource: "receive"}
        if isinstance(source, CudaIpcSource):
            assert "weights" not in self.asleep and source.buckets == (b"handle",) and source.plan == PLAN
        self.events.append((self.name, kinds[type(source)], version))
        self.version, self.freed = version, False
        return version


class FakeServices:
    def __init__(self, trainer, generators):
        self.trainer, self.failed = trainer, []
        self._handles = [GeneratorHandle(g.name, g, 8) for g in generators]

    def all_generators(self):
        return [h for h in self._handles if h.member_id not in self.failed]

    def generator_failed(self, handle, exc):
        self.failed.append(handle.member_id)


def _fake_collect(ctx, batch, prompts, sampling):
    """Generation through every admitted generator, then fixed episodes (rewards with variance)
    sampled by the published version (what the admitted generators serve)."""
    for handle in ctx.generators():
        list(handle.client.generate(prompts, sampling))
    version = ctx.publisher.version
    return [[Episode("t", [3, 4], [-1.0, -1.0], None, float(g), g > 0, "stop", version) for g in range(2)]
            for _ in prompts]


def _loop(monkeypatch, colocated, device_type, dies_on_sleep=False, refuses_sleep=False, overrides=()):
    monkeypatch.setattr(rollouts_module, "collect_episodes", _fake_collect)
    cfg = load_config(overrides=["policy.train_global_batch_size=4", "grpo.num_prompts_per_step=2",
                                 "grpo.num_generations_per_prompt=2", "cluster.num_generators=2",
                                 f"policy.generation.colocated.enabled={str(colocated).lower()}", *overrides])
    events = []
    generators = [FakeGenerator("g0", events), FakeGenerator("g1", events, dies_on_sleep, refuses_sleep)]
    services = FakeServices(FakeTrainer(events, device_type), generators)
    examples = [Example(f"q{i}", "a", "arithmetic", (1, i)) for i in range(8)]
    ctx = LoopContext.connect(cfg, services, SimpleNamespace(prompt=lambda text: [1, 2]), examples, 0,
                              structlog.get_logger())
    return ctx, events, generators


def _of(events, actor):
    return [e[1:] for e in events if e[0] == actor]


def test_colocated_gpu_generators_sleep_from_rollouts_to_publish(monkeypatch):
    ctx, events, generators = _loop(monkeypatch, colocated=True, device_type="cuda")
    ctx.publish()  # the first version: nothing sleeps yet
    for step in (1, 2):
        metrics = grpo_module.grpo_step(ctx, step)
        assert metrics["weight_version"] == step + 1
    for g in ("g0", "g1"):
        assert _of(events, g) == [("load_ipc", 1),
                                  ("generate",), ("sleep", 1), ("wake", "weights"), ("load_ipc", 2), ("wake", "kv_cache"),
                                  ("generate",), ("sleep", 1), ("wake", "weights"), ("load_ipc", 3), ("wake", "kv_cache")]
        assert _of(events, g).count(("wake", "weights")) == 2  # once per publish, by the transport
    assert _of(events, "trainer") == [("export", 1), ("release", 1), ("train",), ("export", 2), ("release", 2),
                                      ("train",), ("export", 3), ("release", 3)]
    trains = [i for i, e in enumerate(events) if e == ("trainer", "train")]
    for version, previous, train in ((2, -1, trains[0]), (3, trains[0], trains[1])):
        def after(start, event):
            return events.index(event, start + 1)

        sleeps = [after(previous, (g, "sleep", 1)) for g in ("g0", "g1")]
        wakes_w = [after(train, (g, "wake", "weights")) for g in ("g0", "g1")]
        loads = [after(train, (g, "load_ipc", version)) for g in ("g0", "g1")]
        wakes_kv = [after(train, (g, "wake", "kv_cache")) for g in ("g0", "g1")]
        assert max(sleeps) < train < min(wakes_w)  # the trainer trains while every generator sleeps
        # the trainer exports (emptying its CUDA cache) before vLLM takes its weights' memory back
        assert max(sleeps) < train < after(train, ("trainer", "export", version)) < min(wakes_w)
        assert max(wakes_w) < min(loads)
        assert max(loads) < after(train, ("trainer", "release", version)) < min(wakes_kv)  # held until all read
    assert all(not g.asleep for g in generators) and ctx.phases.asleep == []


def test_dedicated_gpu_generators_and_cpu_ones_keeping_their_weights_never_sleep(monkeypatch):
    keep = ["policy.generation.free_weights_while_training=false"]
    for colocated, device_type, load, overrides in ((True, "cpu", "load_shared", keep), (False, "cuda", "receive", ()),
                                                    (False, "cpu", "receive", keep)):
        ctx, events, _ = _loop(monkeypatch, colocated, device_type, overrides=overrides)
        ctx.publish()
        grpo_module.grpo_step(ctx, 1)
        assert not any(e[1] in ("sleep", "wake", "export", "release") for e in events), events
        assert _of(events, "g0") == [(load, 1), ("generate",), (load, 2)]


def test_cpu_generators_free_their_weights_from_the_rollouts_to_the_publish(monkeypatch):
    for colocated, load in ((False, "receive"), (True, "load_shared")):
        ctx, events, generators = _loop(monkeypatch, colocated, "cpu")
        ctx.publish()
        for step in (1, 2):
            grpo_module.grpo_step(ctx, step)
        for g in ("g0", "g1"):  # no wake-up calls: the load is the wake-up
            assert _of(events, g) == [(load, 1), ("generate",), ("sleep", FREE_WEIGHTS_LEVEL), (load, 2),
                                      ("generate",), ("sleep", FREE_WEIGHTS_LEVEL), (load, 3)]
        trains = [i for i, e in enumerate(events) if e == ("trainer", "train")]
        assert events.index(("g1", "sleep", FREE_WEIGHTS_LEVEL)) < trains[0]  # freed before the trainer's step
        assert not any(g.freed for g in generators) and ctx.phases.asleep == []


def test_a_cpu_generator_that_cannot_free_its_weights_keeps_them_and_the_run_goes_on(monkeypatch):
    ctx, events, _ = _loop(monkeypatch, False, "cpu", refuses_sleep=True)  # e.g. external, started without the key
    ctx.publish()
    grpo_module.grpo_step(ctx, 1)
    assert ctx.services.failed == []
    assert _of(events, "g1") == [("receive", 1), ("generate",), ("receive", 2)]
    assert _of(events, "g0")[2] == ("sleep", FREE_WEIGHTS_LEVEL)


def test_free_weights_while_training_resolves_by_mode_and_refuses_async():
    assert load_config().generators_free_weights
    assert not load_config(overrides=["policy.generation.free_weights_while_training=false"]).generators_free_weights
    async_run = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]
    assert not load_config(overrides=async_run).generators_free_weights
    assert not load_config(overrides=["cluster.gpus_per_node=1"]).generators_free_weights
    with pytest.raises(ConfigError, match="free_weights_while_training: false"):
        load_config(overrides=[*async_run, "policy.generation.free_weights_while_training=true"])
    scratch = Path(".tandem/scratch")
    assert generator_settings(load_config(), "m", 0, scratch).free_weights_while_training


def test_a_generator_unreachable_at_sleep_is_dropped_and_the_step_goes_on(monkeypatch):
    ctx, events, _ = _loop(monkeypatch, colocated=True, device_type="cuda", dies_on_sleep=True)
    ctx.publish()
    grpo_module.grpo_step(ctx, 1)
    assert ctx.services.failed == ["g1"]
    assert _of(events, "g0")[-3:] == [("wake", "weights"), ("load_ipc", 2), ("wake", "kv_cache")]


def test_gpu_memory_share_of_the_generators_is_validated_and_resolved():
    scratch = Path(".tandem/scratch")  # vLLM's socket paths must stay short
    for bad in ("0", "1.2", "-0.1"):
        with pytest.raises(ConfigError, match="gpu_memory_utilization"):
            load_config(overrides=[f"policy.generation.vllm_cfg.gpu_memory_utilization={bad}"])
    with pytest.raises(ConfigError, match="leaves nothing of the GPU"):
        load_config(overrides=["policy.generation.colocated.enabled=true", "cluster.num_generators=2",
                               "policy.generation.vllm_cfg.gpu_memory_utilization=0.5"])
    dedicated = load_config(overrides=["policy.generation.vllm_cfg.gpu_memory_utilization=0.7"])
    assert generator_settings(dedicated, "m", 0, scratch).gpu_memory_utilization == 0.7
    assert generator_settings(load_config(), "m", 0, scratch).gpu_memory_utilization == 0.9
    colocated = load_config(overrides=["policy.generation.colocated.enabled=true", "cluster.num_generators=2"])
    settings = generator_settings(colocated, "m", 0, scratch)
    assert settings.colocated and settings.gpu_memory_utilization == 0.25


def test_a_publish_failing_before_the_load_still_wakes_the_weights_then_the_kv_cache():
    from coordinator.loop.weights.phases import GeneratorPhases
    from tandem.colocation import resolve_colocation

    events = []
    phases = GeneratorPhases(resolve_colocation(True, "cuda"), structlog.get_logger())
    phases.release([SimpleNamespace(member_id="g0", client=FakeGenerator("g0", events))])

    def failing_export():
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        phases.publish(failing_export)
    assert _of(events, "g0") == [("sleep", 1), ("wake", "weights"), ("wake", "kv_cache")]
    assert phases.asleep == []
