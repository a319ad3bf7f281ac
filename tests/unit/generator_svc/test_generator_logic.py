"""Pure logic of generator_svc: seed layout, vLLM output mapping, settings, wire conversions."""

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from generator_svc.config import GeneratorSettings, run_dir, vllm_environment
from generator_svc.engines.vllm_outputs import (
    finish_reason_from_vllm,
    sampled_logprobs,
    to_completion,
    weight_version_of,
)
from tandem.generation.convert import (
    completion_from_pb,
    completion_to_pb,
    sampling_from_pb,
    sampling_to_pb,
    source_from_pb,
    source_to_pb,
)
from tandem.generation.types import Completion, SamplingConfig
from tandem.weight_source import CollectiveSource, CudaIpcSource, SharedMemorySource, source_from_json, source_to_json
from tandem.weight_sync import GroupSpec, make_bucket_plan


def test_seeds_of_every_sample_are_distinct_and_strided():
    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=8, seed=100)
    seeds = [sampling.sample_seed(i, j) for i in range(3) for j in range(4)]
    assert seeds == list(range(100, 112))
    # a share of prompts that starts at prompt 2 (the coordinator's split) continues the same layout
    share = replace(sampling, seed=100 + 2 * 4)
    assert share.sample_seed(0, 1) == sampling.sample_seed(2, 1)
    assert SamplingConfig(n=4, temperature=1.0, max_tokens=8).sample_seed(1, 1) is None


@pytest.mark.parametrize("kwargs, word", [
    ({"n": 0}, "n must"), ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"max_tokens": 0}, "max_tokens")])
def test_bad_sampling_is_a_value_error_naming_the_field(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingConfig(**{"n": 1, "temperature": 1.0, "max_tokens": 4, **kwargs})


@pytest.mark.parametrize("vllm_reason, ours", [
    ("stop", "stop"), ("length", "length"), ("abort", "abort"), ("error", "abort"), ("repetition", "stop")])
def test_finish_reasons_map_onto_stop_length_abort(vllm_reason, ours):
    assert finish_reason_from_vllm(vllm_reason) == ours


def test_unknown_or_missing_finish_reason_is_an_invariant_violation():
    with pytest.raises(AssertionError):
        finish_reason_from_vllm("teapot")
    with pytest.raises(AssertionError):
        finish_reason_from_vllm(None)


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Span:
    version: str
    start: int
    end: int


@dataclass
class _Output:
    token_ids: list
    logprobs: list
    finish_reason: str
    weight_versions: list | None


def test_sampled_logprobs_pick_the_sampled_token_of_each_step():
    steps = [{7: _Logprob(-1.5)}, {3: _Logprob(-0.25)}]
    assert sampled_logprobs([7, 3], steps) == (-1.5, -0.25)
    with pytest.raises(AssertionError):
        sampled_logprobs([7, 3, 4], steps)
    with pytest.raises(AssertionError):
        sampled_logprobs([7], None)


def test_weight_version_comes_from_spans_oldest_first():
    assert weight_version_of([_Span("3", 0, 5)], current=9) == 3
    assert weight_version_of([_Span("4", 0, 2), _Span("5", 2, 5)], current=9) == 4
    assert weight_version_of(None, current=9) == 9


def test_vllm_output_becomes_a_completion():
    out = _Output([5, 2], [{5: _Logprob(-0.5)}, {2: _Logprob(-2.0)}], "stop", [_Span("1", 0, 2)])
    assert to_completion(out, 3, 1, current_version=0) == Completion(
        prompt_index=3, sample_index=1, token_ids=(5, 2), logprobs=(-0.5, -2.0), finish_reason="stop",
        weight_version=1)


@pytest.fixture
def short_dir():
    """A scratch dir short enough for vLLM's unix-socket paths (pytest's tmp_path may not be)."""
    path = Path(tempfile.mkdtemp(prefix="tg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_settings_forbid_unknown_keys_and_bad_core_lists(short_dir):
    with pytest.raises(ValidationError, match="max_num_seq"):
        GeneratorSettings.model_validate({"model_name": "m", "max_num_seq": 4, "scratch_dir": str(short_dir)})
    with pytest.raises(ValidationError, match="cpu_threads_bind"):
        GeneratorSettings(model_name="m", cpu_threads_bind="core0", scratch_dir=short_dir)
    with pytest.raises(ValidationError, match="shorter path"):
        GeneratorSettings(model_name="m", scratch_dir=Path("/") / ("x" * 80))
    assert GeneratorSettings(model_name="m", cpu_threads_bind="0-1,3", scratch_dir=short_dir).cpu_threads_bind == "0-1,3"


def test_vllm_environment_unpinned_by_default_and_inside_scratch(short_dir):
    settings = GeneratorSettings(model_name="m", kv_cache_space_gib=2, scratch_dir=short_dir)
    run = run_dir(settings, 1234)
    env = vllm_environment(settings, {}, run)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["TORCHDYNAMO_DISABLE"] == "1"  # eager: no g++ compile of vLLM's sampler kernel
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(short_dir / "g1234")
    for key in ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[key].startswith(str(short_dir))
    assert "OMP_NUM_THREADS" not in vllm_environment(settings, {"OMP_NUM_THREADS": "2"}, run)
    shared = vllm_environment(settings, {"VLLM_CACHE_ROOT": "/shared/vllm"}, run)  # the environment's cache wins
    assert shared["VLLM_CACHE_ROOT"] == "/shared/vllm" and shared["TORCHINDUCTOR_CACHE_DIR"].startswith(str(short_dir))
    pinned = vllm_environment(replace_settings(settings, cpu_threads_bind="1", enforce_eager=False), {}, run)
    assert pinned["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "OMP_NUM_THREADS" not in pinned
    assert "TORCHDYNAMO_DISABLE" not in pinned


def replace_settings(settings: GeneratorSettings, **changes) -> GeneratorSettings:
    return GeneratorSettings.model_validate({**settings.model_dump(), **changes})


def _sources():
    import torch

    plan = make_bucket_plan([("a.weight", (3, 4), torch.float32), ("b.bias", (5,), torch.bfloat16)], bucket_bytes=48,
                            checksum_window_bytes=64)
    assert plan.window_ends  # the checksum windows make the trip too
    group = GroupSpec("127.0.0.1:1234", 3, "s3cret", 4, 12.5)
    handles = tuple(bytes([i, 0, 255]) for i in range(len(plan.bucket_sizes_bytes)))
    return [CollectiveSource(group, 2, plan), SharedMemorySource("/dev/shm/tandem-0/v3"), CudaIpcSource(handles, plan)]


@pytest.mark.parametrize("source", _sources(), ids=lambda s: type(s).__name__)
def test_every_weight_source_survives_the_wire_and_the_json_trip_into_the_worker(source):
    assert source_from_json(source_to_json(source)) == source
    assert source_from_pb(source_to_pb(source, version=5)) == source


def test_a_weight_source_is_checked_where_it_is_made():
    collective, _, ipc = _sources()
    with pytest.raises(ValueError, match="ranks 1..3"):
        CollectiveSource(collective.group, 4, collective.plan)
    with pytest.raises(ValueError, match="CUDA IPC handles"):
        CudaIpcSource(ipc.buckets[:-1], ipc.plan)
    with pytest.raises(ValueError, match="exactly one source"):
        source_from_pb(source_to_pb(SharedMemorySource(""), version=1))


def test_sampling_and_completions_survive_the_wire():
    for seed in (None, 0, 17):
        sampling = SamplingConfig(n=3, temperature=0.5, top_p=0.75, top_k=5, max_tokens=11, seed=seed)
        assert sampling_from_pb(sampling_to_pb(sampling)) == sampling
    completion = Completion(prompt_index=2, sample_index=1, token_ids=(4, 2), logprobs=(-0.5, -0.25),
                            finish_reason="length", weight_version=7)
    assert completion_from_pb(completion_to_pb(completion)) == completion


def test_swap_waits_for_calls_in_flight_and_holds_new_ones_back():
    import asyncio

    from generator_svc.engines.gate import SwapGate

    async def scenario() -> list[str]:
        gate, events = SwapGate(), []
        first_call_in = asyncio.Event()
        release_first = asyncio.Event()

        async def call(name: str, hold: asyncio.Event | None = None):
            async with gate.call():
                events.append(f"{name} start")
                if hold is not None:
                    first_call_in.set()
                    await hold.wait()
                events.append(f"{name} end")

        async def swap():
            async with gate.swap():
                events.append("swap")

        first = asyncio.create_task(call("a", release_first))
        await first_call_in.wait()
        swapping = asyncio.create_task(swap())
        await asyncio.sleep(0.01)
        late = asyncio.create_task(call("b"))  # arrives while the swap waits: must run after it
        await asyncio.sleep(0.01)
        assert events == ["a start"]
        release_first.set()
        await asyncio.gather(first, swapping, late)
        return events

    assert asyncio.run(scenario()) == ["a start", "a end", "swap", "b start", "b end"]


def test_a_cancelled_swap_lets_calls_through_again():
    import asyncio

    from generator_svc.engines.gate import SwapGate

    async def scenario() -> int:
        gate = SwapGate()
        hold = asyncio.Event()

        async def call():
            async with gate.call():
                await hold.wait()

        running = asyncio.create_task(call())
        await asyncio.sleep(0)
        swapping = asyncio.create_task(gate.swap().__aenter__())
        await asyncio.sleep(0.01)
        swapping.cancel()
        await asyncio.gather(swapping, return_exceptions=True)
        async with gate.call():  # not blocked by the abandoned swap
            pass
        hold.set()
        await running
        return gate.num_calls

    assert asyncio.run(scenario()) == 0
