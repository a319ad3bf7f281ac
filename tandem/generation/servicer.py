"""The gRPC servicer of the generator contract (tandem.generator.v1.GeneratorService): proto in,
`GenerationEngine` call, proto out. Shared by the generator service (generator_svc/server.py,
over vLLM) and the trainer serving generation from its own Megatron model
(trainer_svc/server.py), so both speak the contract identically.

Health: the servicer marks the server NOT_SERVING while a weight update leaves the engine's
weights in an unknown state, and SERVING again once an update succeeds.
"""

from __future__ import annotations

import time
from typing import Any

from protos.tandem.generator.v1 import generator_pb2 as pb
from protos.tandem.generator.v1 import generator_pb2_grpc as pb_grpc
from tandem.generation.convert import (
    completion_to_pb,
    info_to_pb,
    memory_from_pb,
    memory_to_pb,
    sampling_from_pb,
    scored_from_pb,
    scores_to_pb,
    source_from_pb,
)
from tandem.generation.engine import GenerationEngine
from tandem.rpc import FailedPrecondition, RunningServer

SERVICE_NAME = "tandem.generator.v1.GeneratorService"


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

    async def ScoreTokens(self, request: pb.ScoreTokensRequest, context: Any) -> pb.ScoreTokensResponse:
        engine = self._engine()
        scores = await engine.score([scored_from_pb(s) for s in request.sequences], request.top_k, request.request_id)
        return pb.ScoreTokensResponse(scores=[scores_to_pb(s) for s in scores],
                                      weight_version=engine.info().weight_version)

    async def ReceiveWeights(self, request: pb.ReceiveWeightsRequest, context: Any) -> pb.ReceiveWeightsResponse:
        engine, started = self._engine(), time.monotonic()
        try:
            version = await engine.load_weights(source_from_pb(request), request.version)
        finally:
            await (self.running.mark_ready() if engine.serving else self.running.mark_not_serving())
        return pb.ReceiveWeightsResponse(weight_version=version,
                                         duration_ms=int((time.monotonic() - started) * 1000))

    async def Sleep(self, request: pb.SleepRequest, context: Any) -> pb.SleepResponse:
        return pb.SleepResponse(sleeping=memory_to_pb(await self._engine().sleep(request.level)))

    async def WakeUp(self, request: pb.WakeUpRequest, context: Any) -> pb.WakeUpResponse:
        sleeping = await self._engine().wake_up(memory_from_pb(request.memory) or None)
        return pb.WakeUpResponse(sleeping=memory_to_pb(sleeping))


def add_to_server(servicer: GeneratorServicer, server: Any) -> None:
    pb_grpc.add_GeneratorServiceServicer_to_server(servicer, server)
