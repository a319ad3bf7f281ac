"""gRPC transport of the generator: proto in, engine call, proto out; plus the serve loop.

The server listens (health NOT_SERVING) while the engine loads, so probes get an answer;
it turns SERVING once the engine is up, and NOT_SERVING again if a weight update leaves
the weights in an unknown state (until a later update succeeds).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from generator_svc.config import GeneratorSettings
from generator_svc.interfaces import GenerationEngine
from generator_svc.types import Completion, GeneratorInfo, SamplingConfig
from protos.tandem.generator.v1 import generator_pb2 as pb
from protos.tandem.generator.v1 import generator_pb2_grpc as pb_grpc
from tandem.convert import group_from_pb, plan_from_pb
from tandem.membership import Announcement, Load, MembershipAgent
from tandem.rpc import FailedPrecondition, RunningServer, start_server

SERVICE_NAME = "tandem.generator.v1.GeneratorService"
_FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingConfig:
    return SamplingConfig(n=msg.n, temperature=msg.temperature, top_p=msg.top_p, top_k=msg.top_k,
                          max_tokens=msg.max_tokens, seed=msg.seed if msg.HasField("seed") else None)


def completion_to_pb(c: Completion) -> pb.GenerateResponse:
    return pb.GenerateResponse(prompt_index=c.prompt_index, sample_index=c.sample_index, token_ids=c.token_ids,
                               logprobs=c.logprobs, finish_reason=_FINISH_REASONS[c.finish_reason],
                               weight_version=c.weight_version)


def info_to_pb(i: GeneratorInfo) -> pb.GetInfoResponse:
    return pb.GetInfoResponse(model_name=i.model_name, weight_version=i.weight_version, engine=i.engine,
                              dtype=i.dtype, max_num_seqs=i.max_num_seqs, num_running=i.num_running)


class GeneratorServicer(pb_grpc.GeneratorServiceServicer):
    """Transport only; `engine` is set once loaded, `running` once the server listens."""

    def __init__(self) -> None:
        self.engine: GenerationEngine | None = None
        self.running: RunningServer | None = None

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

    async def ReceiveWeights(self, request: pb.ReceiveWeightsRequest, context: Any) -> pb.ReceiveWeightsResponse:
        engine, started = self._engine(), time.monotonic()
        try:
            version = await engine.receive_weights(group_from_pb(request.group), request.rank, request.version,
                                                   plan_from_pb(request.bucket_plan))
        finally:
            await (self.running.mark_ready() if engine.serving else self.running.mark_not_serving())
        return pb.ReceiveWeightsResponse(weight_version=version,
                                         duration_ms=int((time.monotonic() - started) * 1000))


def _load(engine: GenerationEngine) -> Load:
    """Heartbeat load: sequences in flight and the weight version served."""
    info = engine.info()
    return Load(num_inflight=info.num_running, weight_version=info.weight_version)


async def _wait_for_stop(stop: asyncio.Event, engine: Any, poll_s: float = 1.0) -> int:
    """0 when asked to stop, 1 when the engine died (a supervisor restarts the process)."""
    while not stop.is_set():
        if engine.dead:
            return 1
        try:
            await asyncio.wait_for(stop.wait(), poll_s)
        except TimeoutError:
            pass
    return 0


def write_address_file(path: Path, address: str) -> None:
    """Write host:port atomically (tmp file, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(address)
    os.replace(tmp, path)


async def serve(settings: GeneratorSettings, *, host: str, port: int, token: str, coordinator: str | None,
                address_file: Path | None, log: Any) -> int:
    """Listen, load the engine, serve until SIGTERM/SIGINT (exit code 0) or engine death (1), then stop."""
    from generator_svc.engines.vllm_engine import VllmEngine  # imports vLLM: after the env is set

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servicer = GeneratorServicer()
    running = servicer.running = await start_server(
        [lambda s: pb_grpc.add_GeneratorServiceServicer_to_server(servicer, s)], [SERVICE_NAME],
        host=host, port=port, token=token, log=log)
    agent: MembershipAgent | None = None
    engine: VllmEngine | None = None
    try:
        started = time.monotonic()
        engine = servicer.engine = await VllmEngine.start(settings, log)
        log.info("engine_loaded", seconds=round(time.monotonic() - started, 1), model=settings.model_name)
        await running.mark_ready()
        if address_file is not None:
            write_address_file(address_file, running.address)
        if coordinator:
            agent = MembershipAgent(coordinator, token, Announcement(
                kind="generator", address=running.address, capacity=settings.max_num_seqs),
                lambda: _load(engine), log)
            agent.start()
        exit_code = await _wait_for_stop(stop, engine)
        log.info("stopping", exit_code=exit_code)
        return exit_code
    finally:
        if agent is not None:
            await agent.stop()
        await running.stop(grace_s=2.0)
        if engine is not None:
            await engine.close()
        log.info("stopped")
