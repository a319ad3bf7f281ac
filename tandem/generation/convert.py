"""Proto <-> plain-type conversion of the generator contract (tandem.generator.v1), used by its
client (generator_svc/client.py) and its servicer (tandem/generation/servicer.py) alike."""

from __future__ import annotations

from protos.tandem.generator.v1 import generator_pb2 as pb
from tandem.convert import (
    enum_from_pb,
    enum_to_pb,
    from_pb,
    group_from_pb,
    group_to_pb,
    plan_from_pb,
    plan_to_pb,
    to_pb,
)
from tandem.generation.types import (
    Completion,
    GeneratorInfo,
    MemoryKind,
    SamplingConfig,
    ScoredSequence,
    SequenceScores,
)
from tandem.weight_source import CollectiveSource, CudaIpcSource, SharedMemorySource, WeightSource

_MEMORY = pb.MemoryKind.DESCRIPTOR


def sampling_to_pb(sampling: SamplingConfig) -> pb.SamplingParams:
    return to_pb(pb.SamplingParams, sampling)


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingConfig:
    return SamplingConfig(**from_pb(msg, SamplingConfig))


def completion_to_pb(completion: Completion) -> pb.GenerateResponse:
    return to_pb(pb.GenerateResponse, completion)


def completion_from_pb(msg: pb.GenerateResponse) -> Completion:
    return Completion(**from_pb(msg, Completion))


def scored_to_pb(sequence: ScoredSequence) -> pb.ScoredSequence:
    return pb.ScoredSequence(token_ids=list(sequence.token_ids), prompt_length=sequence.prompt_length)


def scored_from_pb(msg: pb.ScoredSequence) -> ScoredSequence:
    return ScoredSequence(tuple(msg.token_ids), msg.prompt_length)


def scores_to_pb(scores: SequenceScores) -> pb.SequenceScores:
    top = [pb.TopLogprobs(token_ids=[t for t, _ in position], logprobs=[lp for _, lp in position])
           for position in scores.top]
    return pb.SequenceScores(logprobs=list(scores.logprobs), top=top)


def scores_from_pb(msg: pb.SequenceScores) -> SequenceScores:
    top = tuple(tuple(zip(position.token_ids, position.logprobs)) for position in msg.top)
    return SequenceScores(tuple(msg.logprobs), top)


def info_to_pb(info: GeneratorInfo) -> pb.GetInfoResponse:
    return to_pb(pb.GetInfoResponse, info)


def info_from_pb(msg: pb.GetInfoResponse) -> GeneratorInfo:
    return GeneratorInfo(**from_pb(msg, GeneratorInfo))


def memory_to_pb(kinds: tuple[MemoryKind, ...] | list[MemoryKind]) -> list[int]:
    return [enum_to_pb(_MEMORY, k) for k in kinds]


def memory_from_pb(values) -> tuple[MemoryKind, ...]:
    kinds = tuple(enum_from_pb(_MEMORY, v) for v in values)
    if None in kinds:
        raise ValueError("MEMORY_KIND_UNSPECIFIED is not a memory kind: use WEIGHTS or KV_CACHE")
    return kinds


def source_to_pb(source: WeightSource, version: int) -> pb.ReceiveWeightsRequest:
    """The ReceiveWeights request that loads `version` from `source`."""
    if isinstance(source, CollectiveSource):
        return pb.ReceiveWeightsRequest(group=group_to_pb(source.group), rank=source.rank, version=version,
                                        bucket_plan=plan_to_pb(source.plan))
    if isinstance(source, SharedMemorySource):
        return pb.ReceiveWeightsRequest(version=version, shared_memory_dir=source.directory)
    return pb.ReceiveWeightsRequest(version=version, bucket_plan=plan_to_pb(source.plan),
                                    cuda_ipc_buckets=list(source.buckets))


def source_from_pb(request: pb.ReceiveWeightsRequest) -> WeightSource:
    """The source a ReceiveWeights request names: exactly one of a group, a shared-memory
    directory or CUDA IPC handles."""
    named = [request.HasField("group"), bool(request.shared_memory_dir), bool(request.cuda_ipc_buckets)]
    if sum(named) != 1:
        raise ValueError("ReceiveWeightsRequest must name exactly one source: group (with rank and bucket_plan), "
                         "shared_memory_dir, or cuda_ipc_buckets (with bucket_plan)")
    if request.shared_memory_dir:
        return SharedMemorySource(request.shared_memory_dir)
    plan = plan_from_pb(request.bucket_plan)
    if request.cuda_ipc_buckets:
        return CudaIpcSource(tuple(request.cuda_ipc_buckets), plan)
    return CollectiveSource(group_from_pb(request.group), request.rank, plan)
