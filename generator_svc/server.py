"""gRPC transport of the generator: proto in, engine call, proto out; plus the serve loop.

The server listens (health NOT_SERVING) while the engine loads, so probes get an answer;
it turns SERVING once the engine is up, and NOT_SERVING again if a weight update leaves
the weights in an unknown state (until a later update succeeds).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from generator_svc.config import GeneratorSettings
from generator_svc.interfaces import GenerationEngine
from generator_svc.types import Completion, GeneratorInfo, MemoryKind, SamplingConfig
from protos.tandem.generator.v1 import generator_pb2 as pb
from protos.tandem.generator.v1 import generator_pb2_grpc as pb_grpc
from tandem.convert import group_from_pb, plan_from_pb
from tandem import service
from tandem.membership import Announcement, Load
from tandem.rpc import FailedPrecondition, RunningServer, start_server

SERVICE_NAME = "tandem.generator.v1.GeneratorService"
_FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}
_MEMORY_KINDS: dict[MemoryKind, int] = {"weights": pb.MEMORY_KIND_WEIGHTS, "kv_cache": pb.MEMORY_KIND_KV_CACHE}


def memory_to_pb(kinds: tuple[MemoryKind, ...]) -> list[int]:
    return [_MEMORY_KINDS[k] for k in kinds]


def memory_from_pb(values) -> list[MemoryKind]:
    by_value = {v: k for k, v in _MEMORY_KINDS.items()}
    if any(v not in by_value for v in values):
        raise ValueError(f"unknown MemoryKind values {list(values)}: use WEIGHTS or KV_CACHE")
    return [by_value[v] for v in values]


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingConfig:
    return SamplingConfig(n=msg.n, temperature=msg.temperature, top_p=msg.top_p, top_k=msg.top_k,
                          max_tokens=msg.max_tokens, seed=msg.seed if msg.HasField("seed") else None)


def completion_to_pb(c: Completion) -> pb.GenerateResponse:
    return pb.GenerateResponse(prompt_index=c.prompt_index, sample_index=c.sample_index, token_ids=c.token_ids,
                               logprobs=c.logprobs, finish_reason=_FINISH_REASONS[c.finish_reason],
                               weight_version=c.weight_version)


def info_to_pb(i: GeneratorInfo) -> pb.GetInfoResponse:
    return pb.GetInfoResponse(model_name=i.model_name, weight_version=i.weight_version, engine=i.engine,
                              dtype=i.dtype, max_num_seqs=i.max_num_seqs, num_running=i.num_running,
                              sleeping=memory_to_pb(i.sleeping))


class GeneratorServicer(pb_grpc.GeneratorServiceServicer):
    """Transport only; `engine` is set once loaded, `running` once the server listens."""

    def __init__(self, log: Any = None) -> None:
        self.engine: GenerationEngine | None = None
        self.running: RunningServer | None = None
        self._log = log

    def _engine(self) -> GenerationEngine:
        if self.engine is None:
            raise FailedPrecondition("the generator's engine is still loading")
        return self.engine

    async def GetInfo(self, request: pb.GetInfoRequest, context: Any) -> pb.GetInfoResponse:
        return info_to_pb(self._engine().info())

    async def Generate(self, request: pb.GenerateRequest, context: Any):
        prompts = [list(p.token_ids) for p in request.prompts]
        async for completion in self._engine().generate(prompts, sampling_from_pb(request.sampling),
                                                         request.request_id):
            yield completion_to_pb(completion)
        if self._log is not None:  # one line per request: which replica served how much (compose tests read it)
            self._log.info("generate_served", request_id=request.request_id, prompts=len(prompts))

    async def ReceiveWeights(self, request: pb.ReceiveWeightsRequest, context: Any) -> pb.ReceiveWeightsResponse:
        engine, started = self._engine(), time.monotonic()
        try:
            if request.cuda_ipc_buckets:  # colocated on a GPU: read the trainer's buckets in place
                version = await engine.load_cuda_ipc_weights(list(request.cuda_ipc_buckets),
                                                             plan_from_pb(request.bucket_plan), request.version)
            elif request.shared_memory_dir:  # colocated on CPU: no group to join
                version = await engine.load_shared_weights(request.shared_memory_dir, request.version)
            else:
                version = await engine.receive_weights(group_from_pb(request.group), request.rank, request.version,
                                                       plan_from_pb(request.bucket_plan))
        finally:
            await (self.running.mark_ready() if engine.serving else self.running.mark_not_serving())
        return pb.ReceiveWeightsResponse(weight_version=version,
                                         duration_ms=int((time.monotonic() - started) * 1000))

    async def Sleep(self, request: pb.SleepRequest, context: Any) -> pb.SleepResponse:
        return pb.SleepResponse(sleeping=memory_to_pb(await self._engine().sleep(request.level)))

    async def WakeUp(self, request: pb.WakeUpRequest, context: Any) -> pb.WakeUpResponse:
        sleeping = await self._engine().wake_up(memory_from_pb(request.memory) or None)
        return pb.WakeUpResponse(sleeping=memory_to_pb(sleeping))


def _load(engine: GenerationEngine) -> Load:
    """Heartbeat load: sequences in flight and the weight version served."""
    info = engine.info()
    return Load(num_inflight=info.num_running, weight_version=info.weight_version)


async def serve(settings: GeneratorSettings, args: argparse.Namespace, token: str, log: Any) -> int:
    """Listen (NOT_SERVING) while the engine loads, then serve until SIGTERM/SIGINT (exit code 0,
    after draining: leave the coordinator's rotation, finish the calls in flight) or engine
    death (1); the lifecycle is tandem.service.serve's."""
    from generator_svc.engines.vllm_engine import VllmEngine  # imports vLLM: after the env is set

    servicer = GeneratorServicer(log)
    running = servicer.running = await start_server(
        [lambda s: pb_grpc.add_GeneratorServiceServicer_to_server(servicer, s)], [SERVICE_NAME],
        host=args.host, port=args.port, token=token, log=log)

    async def load_engine() -> None:
        started = time.monotonic()
        servicer.engine = await VllmEngine.start(settings, log)
        log.info("engine_loaded", seconds=round(time.monotonic() - started, 1), model=settings.model_name)

    async def close_engine() -> None:
        if servicer.engine is not None:
            await servicer.engine.close()

    async def drain_engine() -> None:  # SIGTERM: finish (or hand back) the requests in flight
        if servicer.engine is not None:
            await servicer.engine.drain(settings.drain_timeout_s)

    announcement = Announcement(kind="generator", address=f"{args.advertise_host or args.host}:{running.port}",
                                capacity=settings.max_num_seqs)
    return await service.serve(running, args, announcement, lambda: _load(servicer.engine), log,
                               on_stop=close_engine, ready=load_engine, drain=drain_engine,
                               dead=lambda: servicer.engine is not None and servicer.engine.dead)
