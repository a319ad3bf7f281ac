from protos.tandem.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_KIND_UNSPECIFIED: _ClassVar[MemoryKind]
    MEMORY_KIND_WEIGHTS: _ClassVar[MemoryKind]
    MEMORY_KIND_KV_CACHE: _ClassVar[MemoryKind]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
MEMORY_KIND_UNSPECIFIED: MemoryKind
MEMORY_KIND_WEIGHTS: MemoryKind
MEMORY_KIND_KV_CACHE: MemoryKind
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "top_k", "max_tokens", "seed")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling", "request_id")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    sampling: SamplingParams
    request_id: str
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("prompt_index", "sample_index", "token_ids", "logprobs", "finish_reason", "weight_version", "routed_experts")
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    prompt_index: int
    sample_index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    weight_version: int
    routed_experts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_index: _Optional[int] = ..., sample_index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., weight_version: _Optional[int] = ..., routed_experts: _Optional[_Iterable[int]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("model_name", "weight_version", "engine", "dtype", "max_num_seqs", "num_running", "sleeping")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    weight_version: int
    engine: str
    dtype: str
    max_num_seqs: int
    num_running: int
    sleeping: _containers.RepeatedScalarFieldContainer[MemoryKind]
    def __init__(self, model_name: _Optional[str] = ..., weight_version: _Optional[int] = ..., engine: _Optional[str] = ..., dtype: _Optional[str] = ..., max_num_seqs: _Optional[int] = ..., num_running: _Optional[int] = ..., sleeping: _Optional[_Iterable[_Union[MemoryKind, str]]] = ...) -> None: ...

class ReceiveWeightsRequest(_message.Message):
    __slots__ = ("group", "rank", "version", "bucket_plan", "shared_memory_dir", "cuda_ipc_buckets")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_PLAN_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_DIR_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightSyncGroup
    rank: int
    version: int
    bucket_plan: _common_pb2.BucketPlan
    shared_memory_dir: str
    cuda_ipc_buckets: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightSyncGroup, _Mapping]] = ..., rank: _Optional[int] = ..., version: _Optional[int] = ..., bucket_plan: _Optional[_Union[_common_pb2.BucketPlan, _Mapping]] = ..., shared_memory_dir: _Optional[str] = ..., cuda_ipc_buckets: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReceiveWeightsResponse(_message.Message):
    __slots__ = ("weight_version", "duration_ms")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    duration_ms: int
    def __init__(self, weight_version: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class SleepRequest(_message.Message):
    __slots__ = ("level",)
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    level: int
    def __init__(self, level: _Optional[int] = ...) -> None: ...

class SleepResponse(_message.Message):
    __slots__ = ("sleeping",)
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    sleeping: _containers.RepeatedScalarFieldContainer[MemoryKind]
    def __init__(self, sleeping: _Optional[_Iterable[_Union[MemoryKind, str]]] = ...) -> None: ...

class WakeUpRequest(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: _containers.RepeatedScalarFieldContainer[MemoryKind]
    def __init__(self, memory: _Optional[_Iterable[_Union[MemoryKind, str]]] = ...) -> None: ...

class WakeUpResponse(_message.Message):
    __slots__ = ("sleeping",)
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    sleeping: _containers.RepeatedScalarFieldContainer[MemoryKind]
    def __init__(self, sleeping: _Optional[_Iterable[_Union[MemoryKind, str]]] = ...) -> None: ...

class ScoredSequence(_message.Message):
    __slots__ = ("token_ids", "prompt_length")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_length: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., prompt_length: _Optional[int] = ...) -> None: ...

class TopLogprobs(_message.Message):
    __slots__ = ("token_ids", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ScoreTokensRequest(_message.Message):
    __slots__ = ("sequences", "top_k", "request_id")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[ScoredSequence]
    top_k: int
    request_id: str
    def __init__(self, sequences: _Optional[_Iterable[_Union[ScoredSequence, _Mapping]]] = ..., top_k: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class SequenceScores(_message.Message):
    __slots__ = ("logprobs", "top")
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    top: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    def __init__(self, logprobs: _Optional[_Iterable[float]] = ..., top: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ...) -> None: ...

class ScoreTokensResponse(_message.Message):
    __slots__ = ("scores", "weight_version")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[SequenceScores]
    weight_version: int
    def __init__(self, scores: _Optional[_Iterable[_Union[SequenceScores, _Mapping]]] = ..., weight_version: _Optional[int] = ...) -> None: ...
