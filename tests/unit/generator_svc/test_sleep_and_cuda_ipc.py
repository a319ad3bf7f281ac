"""Colocated-GPU parts of the generator without vLLM or a GPU: the engine arguments, the sleep
state machine of VllmEngine over a fake AsyncLLM (refusals, ordering, no pause/resume while the
KV cache sleeps), and the Sleep/WakeUp/ReceiveWeights(cuda_ipc_buckets) wire round trip from
the client through serialized protos to the servicer."""

import asyncio
import json

import pytest
import structlog
import torch
from pydantic import ValidationError

from generator_svc.client import GeneratorClient
from generator_svc.config import GeneratorSettings, vllm_environment
from generator_svc.engines.sleep import SleepMode, memory_args
from generator_svc.engines.vllm_engine import VllmEngine
from generator_svc.worker_extension import RELEASE
from tandem.generation.servicer import GeneratorServicer
from tandem.generation.types import SamplingConfig
from tandem.rpc import FailedPrecondition
from tandem.weight_source import CudaIpcSource
from tandem.weight_sync import make_bucket_plan

PLAN = make_bucket_plan([("w", (4,), torch.float32)])


class FakeLlm:
    """The AsyncLLM calls VllmEngine makes, recorded."""

    errored = False

    def __init__(self):
        self.calls = []
        self.engine_core = self.renderer = self

    async def sleep(self, level):
        self.calls.append(("sleep", level))

    async def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))
        return True

    async def collective_rpc(self, name, timeout=None, args=()):
        self.calls.append(("rpc", name))
        return [{"freed_layers": 3, "freed_weight_bytes": 64}] if name == RELEASE else [1]

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    async def set_weight_version_async(self, version):
        self.calls.append(("version", version))

    async def clear_mm_cache_async(self):
        pass

    async def pause_scheduler_async(self, mode, clear_cache):
        self.calls.append(("pause",))

    async def resume_generation(self):
        self.calls.append(("resume",))


def _engine(sleep_mode=SleepMode.VLLM, colocated=True):
    settings = GeneratorSettings(model_name="unused", colocated=colocated)
    return VllmEngine(FakeLlm(), settings, "test", structlog.get_logger(), sleep_mode=sleep_mode)


async def _generate(engine):
    async for _ in engine.generate([[1]], SamplingConfig(n=1, temperature=1.0, max_tokens=1)):
        pass


def test_memory_args_enable_sleep_mode_only_for_colocated_generators_on_cuda():
    colocated = GeneratorSettings(model_name="m", colocated=True, gpu_memory_utilization=0.4)
    assert memory_args(colocated, "cpu") == {"kv_cache_memory_bytes": 1 << 30}  # no config.json to size it from
    fixed = GeneratorSettings(model_name="m", kv_cache_space_gib=2)
    assert memory_args(fixed, "cpu") == {}  # VLLM_CPU_KVCACHE_SPACE sizes it
    assert memory_args(colocated, "cuda") == {"gpu_memory_utilization": 0.4, "enable_sleep_mode": True}
    dedicated = GeneratorSettings(model_name="m")
    assert memory_args(dedicated, "cuda") == {"gpu_memory_utilization": 0.9, "enable_sleep_mode": False}
    for bad in (0.0, 1.5):
        with pytest.raises(ValidationError, match="gpu_memory_utilization"):
            GeneratorSettings(model_name="m", gpu_memory_utilization=bad)


def test_sleep_is_refused_without_sleep_mode_and_for_bad_levels():
    async def scenario():
        with pytest.raises(FailedPrecondition, match="without vLLM sleep mode"):
            await _engine(sleep_mode=SleepMode.NONE, colocated=False).sleep(1)
        with pytest.raises(ValueError, match="level"):
            await _engine().sleep(3)

    asyncio.run(scenario())


def test_a_cpu_generator_frees_its_weights_at_level_two_until_a_version_is_loaded():
    async def scenario():
        engine = _engine(sleep_mode=SleepMode.FREE_WEIGHTS, colocated=False)
        with pytest.raises(FailedPrecondition, match="can only free its weights"):
            await engine.sleep(1)
        assert await engine.sleep(2) == ()  # nothing asleep: the KV cache stays, the weights are gone
        with pytest.raises(FailedPrecondition, match="level-2 sleep freed"):
            await _generate(engine)
        assert await engine.wake_up() == ()  # nothing to wake: vLLM is not asked
        with pytest.raises(FailedPrecondition, match="level-2 sleep freed"):
            await _generate(engine)
        assert await engine.load_weights(CudaIpcSource((b"h",), PLAN), 1) == 1
        engine._sleep.check_can_generate()
        assert [c for c in engine._llm.calls if c[0] in ("rpc", "sleep", "wake_up")] == [
            ("rpc", RELEASE), ("rpc", "tandem_stage"), ("rpc", "tandem_apply_staged")]

    asyncio.run(scenario())


def test_sleep_wake_weights_load_wake_kv_in_order_and_generation_refused_meanwhile():
    async def scenario():
        engine = _engine()
        llm = engine._llm
        assert await engine.sleep(1) == ("weights", "kv_cache")
        assert await engine.sleep(1) == ("weights", "kv_cache")  # idempotent: vLLM is asked once
        assert engine.info().sleeping == ("weights", "kv_cache")
        with pytest.raises(FailedPrecondition, match="asleep"):
            await _generate(engine)
        with pytest.raises(FailedPrecondition, match="wake up the weights"):
            await engine.load_weights(CudaIpcSource((b"h",), PLAN), 1)
        assert await engine.wake_up(["weights"]) == ("kv_cache",)
        assert await engine.load_weights(CudaIpcSource((b"h",), PLAN), 1) == 1
        with pytest.raises(FailedPrecondition, match="asleep"):
            await _generate(engine)  # the KV cache still sleeps
        assert await engine.wake_up() == ()
        assert await engine.wake_up() == ()  # nothing left: vLLM is not asked again
        assert llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("rpc", "tandem_stage"),
                             ("rpc", "tandem_apply_staged"), ("reset_prefix_cache",), ("version", "1"),
                             ("wake_up", ("kv_cache",))]  # no pause/resume: the sleep paused the scheduler
        assert engine.info().weight_version == 1 and engine.info().sleeping == ()

    asyncio.run(scenario())


def test_an_awake_engine_pauses_around_the_swap_and_checks_the_handle_count():
    async def scenario():
        engine = _engine()
        with pytest.raises(ValueError, match="2 CUDA IPC handles for a plan of 1"):
            CudaIpcSource((b"a", b"b"), PLAN)
        await engine.load_weights(CudaIpcSource((b"h",), PLAN), 1)
        names = [c[0] for c in engine._llm.calls]
        assert names == ["rpc", "pause", "rpc", "reset_prefix_cache", "version", "resume"]

    asyncio.run(scenario())


def test_sleep_waits_for_the_calls_in_flight():
    async def scenario():
        engine = _engine()
        release = asyncio.Event()

        async def call_in_flight():
            async with engine._gate.call():
                await release.wait()

        task = asyncio.create_task(call_in_flight())
        await asyncio.sleep(0.01)
        sleeping = asyncio.create_task(engine.sleep(1))
        await asyncio.sleep(0.1)
        assert not sleeping.done() and engine._llm.calls == []
        release.set()
        assert await sleeping == ("weights", "kv_cache")
        await task

    asyncio.run(scenario())


def test_level_two_discards_the_weights_until_a_version_is_loaded():
    async def scenario():
        engine = _engine()
        await engine.sleep(2)
        await engine.wake_up()
        with pytest.raises(FailedPrecondition, match="level-2 sleep freed"):
            await _generate(engine)
        await engine.sleep(2)
        await engine.wake_up(["weights"])
        await engine.load_weights(CudaIpcSource((b"h",), PLAN), 1)
        await engine.wake_up(["kv_cache"])
        engine._sleep.check_can_generate()

    asyncio.run(scenario())


class _Running:
    async def mark_ready(self):
        pass

    async def mark_not_serving(self):
        pass


class _WireStub:
    """Sends each request through its serialized bytes to the servicer and the reply back."""

    def __init__(self, servicer):
        self._servicer = servicer

    def __getattr__(self, name):
        def call(request, timeout):
            parsed = type(request).FromString(request.SerializeToString())
            reply = asyncio.run(getattr(self._servicer, name)(parsed, None))
            return type(reply).FromString(reply.SerializeToString())
        return call


class _RecordingEngine:
    serving = True

    def __init__(self):
        self.seen = []

    async def load_weights(self, source, version):
        self.seen.append(("ipc", source.buckets, source.plan, version))
        return version

    async def sleep(self, level):
        self.seen.append(("sleep", level))
        return ("weights", "kv_cache")

    async def wake_up(self, memory=None):
        self.seen.append(("wake_up", memory))
        return () if memory is None else ("kv_cache",)


def test_the_wire_carries_sleep_wake_and_cuda_ipc_handles():
    servicer = GeneratorServicer()
    servicer.engine, servicer.running = _RecordingEngine(), _Running()
    client = GeneratorClient("127.0.0.1:1", None)
    client._stub = _WireStub(servicer)
    try:
        assert client.sleep(1) == ("weights", "kv_cache")
        assert client.wake_up(["weights"]) == ("kv_cache",)
        assert client.wake_up() == ()
        payloads = (b"\x00handle-0", b"\xffhandle-1")
        plan = make_bucket_plan([("a", (8,), torch.float32), ("b", (8,), torch.float32)], 32)
        assert client.load_weights(CudaIpcSource(payloads, plan), 7) == 7
    finally:
        client.close()
    assert servicer.engine.seen == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", None),
                                    ("ipc", payloads, plan, 7)]


def test_the_cpu_kv_cache_is_sized_from_the_workload(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936}))
    settings = GeneratorSettings(model_name=str(tmp_path), max_num_seqs=32, max_model_len=32, dtype="float32")
    # 32 sequences x 32 tokens x (2 x 24 layers x 2 heads x 64 x 4 bytes) x 1.25
    assert memory_args(settings, "cpu") == {"kv_cache_memory_bytes": 32 * 32 * 24576 * 5 // 4}
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_environment(settings, {}, tmp_path)
