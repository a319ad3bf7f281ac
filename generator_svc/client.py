"""Typed synchronous client of `tandem.generator.v1.GeneratorService` (plain dataclasses out).

Every call carries the shared token and a deadline; a failed call raises `tandem.rpc.RpcFailure`
with the server's status. `generate` streams: completions come back one by one as the
generator finishes them, in no particular order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from protos.tandem.generator.v1 import generator_pb2 as pb
from protos.tandem.generator.v1 import generator_pb2_grpc as pb_grpc
from tandem.generation.convert import (
    completion_from_pb,
    info_from_pb,
    memory_from_pb,
    memory_to_pb,
    sampling_to_pb,
    scored_to_pb,
    scores_from_pb,
    source_to_pb,
)
from tandem.generation.types import (
    Completion,
    GeneratorInfo,
    MemoryKind,
    SamplingConfig,
    ScoredSequence,
    SequenceScores,
)
from tandem.rpc import open_channel, rpc_failures
from tandem.weight_source import WeightSource


class GeneratorClient:
    """Client of one generator at `address` ("host:port"); `token=None` sends no token."""

    def __init__(self, address: str, token: str | None) -> None:
        self.address = address
        self._channel = open_channel(address, token)
        self._stub = pb_grpc.GeneratorServiceStub(self._channel)

    @rpc_failures
    def info(self, timeout_s: float = 10.0) -> GeneratorInfo:
        return info_from_pb(self._stub.GetInfo(pb.GetInfoRequest(), timeout=timeout_s))

    @rpc_failures
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, request_id: str = "",
                 timeout_s: float = 600.0) -> Iterator[Completion]:
        """Stream sampling.n completions per prompt (token ids with BOS); the deadline covers the whole stream."""
        request = pb.GenerateRequest(prompts=[pb.Prompt(token_ids=list(p)) for p in prompts],
                                     sampling=sampling_to_pb(sampling), request_id=request_id)
        stream = self._stub.Generate(request, timeout=timeout_s)
        try:
            for msg in stream:
                yield completion_from_pb(msg)
        finally:
            stream.cancel()  # no-op once finished; aborts the generator's work if the caller stops early

    @rpc_failures
    def score(self, sequences: Sequence[ScoredSequence], top_k: int = 0, request_id: str = "",
              timeout_s: float = 600.0) -> list[SequenceScores]:
        """A teacher's logprobs of each sequence's completion tokens (and top_k per position); in order."""
        request = pb.ScoreTokensRequest(sequences=[scored_to_pb(s) for s in sequences], top_k=top_k,
                                        request_id=request_id)
        return [scores_from_pb(s) for s in self._stub.ScoreTokens(request, timeout=timeout_s).scores]

    @rpc_failures
    def load_weights(self, source: WeightSource, version: int, timeout_s: float = 300.0) -> int:
        """Ask the generator to read `version` from `source` and swap it in; returns the version it serves."""
        return self._stub.ReceiveWeights(source_to_pb(source, version), timeout=timeout_s).weight_version

    @rpc_failures
    def sleep(self, level: int = 1, timeout_s: float = 120.0) -> tuple[MemoryKind, ...]:
        """Colocated on a GPU: release the generator's device memory (level 2 on CPU: free its weights until the
        next version is loaded); returns what sleeps (nothing on CPU)."""
        return memory_from_pb(self._stub.Sleep(pb.SleepRequest(level=level), timeout=timeout_s).sleeping)

    @rpc_failures
    def wake_up(self, memory: Sequence[MemoryKind] | None = None, timeout_s: float = 120.0) -> tuple[MemoryKind, ...]:
        """Bring back `memory` (None: everything); returns what still sleeps."""
        reply = self._stub.WakeUp(pb.WakeUpRequest(memory=memory_to_pb(memory or ())), timeout=timeout_s)
        return memory_from_pb(reply.sleeping)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GeneratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
