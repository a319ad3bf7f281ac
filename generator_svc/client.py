"""Typed synchronous client of `tandem.generator.v1.GeneratorService` (plain dataclasses out).

Every call carries the shared token and a deadline. `generate` streams: completions come
back one by one as the generator finishes them, in no particular order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from generator_svc.types import Completion, FinishReason, GeneratorInfo, MemoryKind, SamplingConfig
from protos.tandem.generator.v1 import generator_pb2 as pb
from protos.tandem.generator.v1 import generator_pb2_grpc as pb_grpc
from tandem.convert import group_to_pb, plan_to_pb
from tandem.rpc import open_channel
from tandem.weight_sync import BucketPlan, GroupSpec

_FINISH_REASONS: dict[int, FinishReason] = {
    pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORT: "abort"}
_MEMORY_KINDS: dict[int, MemoryKind] = {pb.MEMORY_KIND_WEIGHTS: "weights", pb.MEMORY_KIND_KV_CACHE: "kv_cache"}
_MEMORY_PB = {v: k for k, v in _MEMORY_KINDS.items()}


def sampling_to_pb(s: SamplingConfig) -> pb.SamplingParams:
    return pb.SamplingParams(n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                             max_tokens=s.max_tokens, seed=s.seed)


def completion_from_pb(msg: pb.GenerateResponse) -> Completion:
    return Completion(prompt_index=msg.prompt_index, sample_index=msg.sample_index,
                      token_ids=tuple(msg.token_ids), logprobs=tuple(msg.logprobs),
                      finish_reason=_FINISH_REASONS[msg.finish_reason], weight_version=msg.weight_version)


class GeneratorClient:
    """Client of one generator at `address` ("host:port"); `token=None` sends no token."""

    def __init__(self, address: str, token: str | None) -> None:
        self.address = address
        self._channel = open_channel(address, token)
        self._stub = pb_grpc.GeneratorServiceStub(self._channel)

    def info(self, timeout_s: float = 10.0) -> GeneratorInfo:
        r = self._stub.GetInfo(pb.GetInfoRequest(), timeout=timeout_s)
        return GeneratorInfo(model_name=r.model_name, weight_version=r.weight_version, engine=r.engine,
                             dtype=r.dtype, max_num_seqs=r.max_num_seqs, num_running=r.num_running,
                             sleeping=tuple(_MEMORY_KINDS[m] for m in r.sleeping))

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

    def receive_weights(self, group: GroupSpec, rank: int, version: int, plan: BucketPlan,
                        timeout_s: float = 300.0) -> int:
        """Ask the generator to join `group` as `rank` and receive `version`; returns the version it serves."""
        reply = self._stub.ReceiveWeights(pb.ReceiveWeightsRequest(
            group=group_to_pb(group), rank=rank, version=version, bucket_plan=plan_to_pb(plan)), timeout=timeout_s)
        return reply.weight_version

    def load_shared_weights(self, directory: str, version: int, timeout_s: float = 300.0) -> int:
        """Colocated mode: ask the generator to load `version` from HF safetensors files in
        `directory` (shared memory on its host); returns the version it serves."""
        reply = self._stub.ReceiveWeights(pb.ReceiveWeightsRequest(version=version, shared_memory_dir=directory),
                                          timeout=timeout_s)
        return reply.weight_version

    def load_cuda_ipc_weights(self, buckets: Sequence[bytes], plan: BucketPlan, version: int,
                              timeout_s: float = 300.0) -> int:
        """Colocated on a GPU: ask the generator to read `version` from the trainer's buckets
        (one CUDA IPC handle per bucket of `plan`); returns the version it serves. The trainer
        may free the buckets once this returns."""
        reply = self._stub.ReceiveWeights(pb.ReceiveWeightsRequest(
            version=version, bucket_plan=plan_to_pb(plan), cuda_ipc_buckets=list(buckets)), timeout=timeout_s)
        return reply.weight_version

    def sleep(self, level: int = 1, timeout_s: float = 120.0) -> tuple[MemoryKind, ...]:
        """Colocated on a GPU: release the generator's device memory; returns what is released."""
        reply = self._stub.Sleep(pb.SleepRequest(level=level), timeout=timeout_s)
        return tuple(_MEMORY_KINDS[m] for m in reply.sleeping)

    def wake_up(self, memory: Sequence[MemoryKind] | None = None, timeout_s: float = 120.0) -> tuple[MemoryKind, ...]:
        """Bring back `memory` (None: everything); returns what still sleeps."""
        reply = self._stub.WakeUp(pb.WakeUpRequest(memory=[_MEMORY_PB[m] for m in memory or ()]), timeout=timeout_s)
        return tuple(_MEMORY_KINDS[m] for m in reply.sleeping)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GeneratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
