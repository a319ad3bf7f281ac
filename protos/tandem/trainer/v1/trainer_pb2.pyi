from protos.tandem.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Backend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_UNSPECIFIED: _ClassVar[Backend]
    BACKEND_DTENSOR: _ClassVar[Backend]
    BACKEND_MEGATRON: _ClassVar[Backend]

class PolicyKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_KIND_UNSPECIFIED: _ClassVar[PolicyKind]
    POLICY_KIND_CURRENT: _ClassVar[PolicyKind]
    POLICY_KIND_REFERENCE: _ClassVar[PolicyKind]

class KlType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KL_TYPE_UNSPECIFIED: _ClassVar[KlType]
    KL_TYPE_K1: _ClassVar[KlType]
    KL_TYPE_K2: _ClassVar[KlType]
    KL_TYPE_K3: _ClassVar[KlType]

class TruncatedImportanceSamplingType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUNCATED_IMPORTANCE_SAMPLING_TYPE_UNSPECIFIED: _ClassVar[TruncatedImportanceSamplingType]
    TRUNCATED_IMPORTANCE_SAMPLING_TYPE_TIS: _ClassVar[TruncatedImportanceSamplingType]
    TRUNCATED_IMPORTANCE_SAMPLING_TYPE_ICEPOP: _ClassVar[TruncatedImportanceSamplingType]
    TRUNCATED_IMPORTANCE_SAMPLING_TYPE_SEQ_MASK_TIS: _ClassVar[TruncatedImportanceSamplingType]
BACKEND_UNSPECIFIED: Backend
BACKEND_DTENSOR: Backend
BACKEND_MEGATRON: Backend
POLICY_KIND_UNSPECIFIED: PolicyKind
POLICY_KIND_CURRENT: PolicyKind
POLICY_KIND_REFERENCE: PolicyKind
KL_TYPE_UNSPECIFIED: KlType
KL_TYPE_K1: KlType
KL_TYPE_K2: KlType
KL_TYPE_K3: KlType
TRUNCATED_IMPORTANCE_SAMPLING_TYPE_UNSPECIFIED: TruncatedImportanceSamplingType
TRUNCATED_IMPORTANCE_SAMPLING_TYPE_TIS: TruncatedImportanceSamplingType
TRUNCATED_IMPORTANCE_SAMPLING_TYPE_ICEPOP: TruncatedImportanceSamplingType
TRUNCATED_IMPORTANCE_SAMPLING_TYPE_SEQ_MASK_TIS: TruncatedImportanceSamplingType

class Sample(_message.Message):
    __slots__ = ("token_ids", "prompt_length", "loss_mask", "generation_logprobs", "advantage", "teacher_logprobs", "token_advantages", "returns", "values", "routed_experts")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_length: int
    loss_mask: _containers.RepeatedScalarFieldContainer[float]
    generation_logprobs: _containers.RepeatedScalarFieldContainer[float]
    advantage: float
    teacher_logprobs: _containers.RepeatedScalarFieldContainer[float]
    token_advantages: _containers.RepeatedScalarFieldContainer[float]
    returns: _containers.RepeatedScalarFieldContainer[float]
    values: _containers.RepeatedScalarFieldContainer[float]
    routed_experts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., prompt_length: _Optional[int] = ..., loss_mask: _Optional[_Iterable[float]] = ..., generation_logprobs: _Optional[_Iterable[float]] = ..., advantage: _Optional[float] = ..., teacher_logprobs: _Optional[_Iterable[float]] = ..., token_advantages: _Optional[_Iterable[float]] = ..., returns: _Optional[_Iterable[float]] = ..., values: _Optional[_Iterable[float]] = ..., routed_experts: _Optional[_Iterable[int]] = ...) -> None: ...

class GrpoLoss(_message.Message):
    __slots__ = ("ratio_clip_min", "ratio_clip_max", "reference_policy_kl_penalty", "use_importance_sampling_correction", "ratio_clip_c", "reference_policy_kl_type", "kl_input_clamp_value", "kl_output_clamp_value", "use_on_policy_kl_approximation", "sequence_level_importance_ratios", "truncated_importance_sampling_ratio", "truncated_importance_sampling_type", "truncated_importance_sampling_ratio_min", "disable_ppo_ratio", "force_on_policy_ratio", "token_level_loss")
    RATIO_CLIP_MIN_FIELD_NUMBER: _ClassVar[int]
    RATIO_CLIP_MAX_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_POLICY_KL_PENALTY_FIELD_NUMBER: _ClassVar[int]
    USE_IMPORTANCE_SAMPLING_CORRECTION_FIELD_NUMBER: _ClassVar[int]
    RATIO_CLIP_C_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_POLICY_KL_TYPE_FIELD_NUMBER: _ClassVar[int]
    KL_INPUT_CLAMP_VALUE_FIELD_NUMBER: _ClassVar[int]
    KL_OUTPUT_CLAMP_VALUE_FIELD_NUMBER: _ClassVar[int]
    USE_ON_POLICY_KL_APPROXIMATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_LEVEL_IMPORTANCE_RATIOS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_IMPORTANCE_SAMPLING_RATIO_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_IMPORTANCE_SAMPLING_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_IMPORTANCE_SAMPLING_RATIO_MIN_FIELD_NUMBER: _ClassVar[int]
    DISABLE_PPO_RATIO_FIELD_NUMBER: _ClassVar[int]
    FORCE_ON_POLICY_RATIO_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LEVEL_LOSS_FIELD_NUMBER: _ClassVar[int]
    ratio_clip_min: float
    ratio_clip_max: float
    reference_policy_kl_penalty: float
    use_importance_sampling_correction: bool
    ratio_clip_c: float
    reference_policy_kl_type: KlType
    kl_input_clamp_value: float
    kl_output_clamp_value: float
    use_on_policy_kl_approximation: bool
    sequence_level_importance_ratios: bool
    truncated_importance_sampling_ratio: float
    truncated_importance_sampling_type: TruncatedImportanceSamplingType
    truncated_importance_sampling_ratio_min: float
    disable_ppo_ratio: bool
    force_on_policy_ratio: bool
    token_level_loss: bool
    def __init__(self, ratio_clip_min: _Optional[float] = ..., ratio_clip_max: _Optional[float] = ..., reference_policy_kl_penalty: _Optional[float] = ..., use_importance_sampling_correction: _Optional[bool] = ..., ratio_clip_c: _Optional[float] = ..., reference_policy_kl_type: _Optional[_Union[KlType, str]] = ..., kl_input_clamp_value: _Optional[float] = ..., kl_output_clamp_value: _Optional[float] = ..., use_on_policy_kl_approximation: _Optional[bool] = ..., sequence_level_importance_ratios: _Optional[bool] = ..., truncated_importance_sampling_ratio: _Optional[float] = ..., truncated_importance_sampling_type: _Optional[_Union[TruncatedImportanceSamplingType, str]] = ..., truncated_importance_sampling_ratio_min: _Optional[float] = ..., disable_ppo_ratio: _Optional[bool] = ..., force_on_policy_ratio: _Optional[bool] = ..., token_level_loss: _Optional[bool] = ...) -> None: ...

class NllLoss(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DpoLoss(_message.Message):
    __slots__ = ("reference_policy_kl_penalty", "preference_loss_weight", "sft_loss_weight", "preference_average_log_probs", "sft_average_log_probs")
    REFERENCE_POLICY_KL_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SFT_LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_AVERAGE_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    SFT_AVERAGE_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    reference_policy_kl_penalty: float
    preference_loss_weight: float
    sft_loss_weight: float
    preference_average_log_probs: bool
    sft_average_log_probs: bool
    def __init__(self, reference_policy_kl_penalty: _Optional[float] = ..., preference_loss_weight: _Optional[float] = ..., sft_loss_weight: _Optional[float] = ..., preference_average_log_probs: _Optional[bool] = ..., sft_average_log_probs: _Optional[bool] = ...) -> None: ...

class BradleyTerryLoss(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DistillationLoss(_message.Message):
    __slots__ = ("kl_penalty_coef", "task_reward_coef", "ratio_clip_min", "ratio_clip_max", "use_importance_sampling_correction")
    KL_PENALTY_COEF_FIELD_NUMBER: _ClassVar[int]
    TASK_REWARD_COEF_FIELD_NUMBER: _ClassVar[int]
    RATIO_CLIP_MIN_FIELD_NUMBER: _ClassVar[int]
    RATIO_CLIP_MAX_FIELD_NUMBER: _ClassVar[int]
    USE_IMPORTANCE_SAMPLING_CORRECTION_FIELD_NUMBER: _ClassVar[int]
    kl_penalty_coef: float
    task_reward_coef: float
    ratio_clip_min: float
    ratio_clip_max: float
    use_importance_sampling_correction: bool
    def __init__(self, kl_penalty_coef: _Optional[float] = ..., task_reward_coef: _Optional[float] = ..., ratio_clip_min: _Optional[float] = ..., ratio_clip_max: _Optional[float] = ..., use_importance_sampling_correction: _Optional[bool] = ...) -> None: ...

class PpoValueLoss(_message.Message):
    __slots__ = ("cliprange_value",)
    CLIPRANGE_VALUE_FIELD_NUMBER: _ClassVar[int]
    cliprange_value: float
    def __init__(self, cliprange_value: _Optional[float] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("samples", "grpo", "nll", "dpo", "bradley_terry", "distillation", "ppo_value", "global_batch_size", "micro_batch_size", "learning_rate")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    NLL_FIELD_NUMBER: _ClassVar[int]
    DPO_FIELD_NUMBER: _ClassVar[int]
    BRADLEY_TERRY_FIELD_NUMBER: _ClassVar[int]
    DISTILLATION_FIELD_NUMBER: _ClassVar[int]
    PPO_VALUE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    grpo: GrpoLoss
    nll: NllLoss
    dpo: DpoLoss
    bradley_terry: BradleyTerryLoss
    distillation: DistillationLoss
    ppo_value: PpoValueLoss
    global_batch_size: int
    micro_batch_size: int
    learning_rate: float
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., grpo: _Optional[_Union[GrpoLoss, _Mapping]] = ..., nll: _Optional[_Union[NllLoss, _Mapping]] = ..., dpo: _Optional[_Union[DpoLoss, _Mapping]] = ..., bradley_terry: _Optional[_Union[BradleyTerryLoss, _Mapping]] = ..., distillation: _Optional[_Union[DistillationLoss, _Mapping]] = ..., ppo_value: _Optional[_Union[PpoValueLoss, _Mapping]] = ..., global_batch_size: _Optional[int] = ..., micro_batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("metrics", "global_step")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    global_step: int
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., global_step: _Optional[int] = ...) -> None: ...

class ComputeLogprobsRequest(_message.Message):
    __slots__ = ("samples", "policy", "micro_batch_size")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    policy: PolicyKind
    micro_batch_size: int
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., policy: _Optional[_Union[PolicyKind, str]] = ..., micro_batch_size: _Optional[int] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprobs",)
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ComputeLogprobsResponse(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    def __init__(self, samples: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ...) -> None: ...

class ComputeValuesRequest(_message.Message):
    __slots__ = ("samples", "micro_batch_size")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    micro_batch_size: int
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., micro_batch_size: _Optional[int] = ...) -> None: ...

class TokenValues(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class ComputeValuesResponse(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[TokenValues]
    def __init__(self, samples: _Optional[_Iterable[_Union[TokenValues, _Mapping]]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("model_name", "model_fingerprint", "backend", "world_size", "device_type", "weight_sync_store_address", "bucket_plan", "num_parameters", "global_step")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_PLAN_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_fingerprint: str
    backend: Backend
    world_size: int
    device_type: str
    weight_sync_store_address: str
    bucket_plan: _common_pb2.BucketPlan
    num_parameters: int
    global_step: int
    def __init__(self, model_name: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., backend: _Optional[_Union[Backend, str]] = ..., world_size: _Optional[int] = ..., device_type: _Optional[str] = ..., weight_sync_store_address: _Optional[str] = ..., bucket_plan: _Optional[_Union[_common_pb2.BucketPlan, _Mapping]] = ..., num_parameters: _Optional[int] = ..., global_step: _Optional[int] = ...) -> None: ...

class PublishWeightsRequest(_message.Message):
    __slots__ = ("group", "version", "detach")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightSyncGroup
    version: int
    detach: bool
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightSyncGroup, _Mapping]] = ..., version: _Optional[int] = ..., detach: _Optional[bool] = ...) -> None: ...

class PublishWeightsResponse(_message.Message):
    __slots__ = ("bytes_sent", "duration_ms")
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    bytes_sent: int
    duration_ms: int
    def __init__(self, bytes_sent: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class HoldWeightsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class HoldWeightsResponse(_message.Message):
    __slots__ = ("num_bytes", "duration_ms")
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    num_bytes: int
    duration_ms: int
    def __init__(self, num_bytes: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("path", "background")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    path: str
    background: bool
    def __init__(self, path: _Optional[str] = ..., background: _Optional[bool] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("duration_ms",)
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    duration_ms: int
    def __init__(self, duration_ms: _Optional[int] = ...) -> None: ...

class CheckpointWrittenRequest(_message.Message):
    __slots__ = ("path", "timeout_s")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    path: str
    timeout_s: float
    def __init__(self, path: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class CheckpointWrittenResponse(_message.Message):
    __slots__ = ("written",)
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    written: bool
    def __init__(self, written: _Optional[bool] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ("global_step",)
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    global_step: int
    def __init__(self, global_step: _Optional[int] = ...) -> None: ...

class ExportHfRequest(_message.Message):
    __slots__ = ("path", "for_generators")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOR_GENERATORS_FIELD_NUMBER: _ClassVar[int]
    path: str
    for_generators: bool
    def __init__(self, path: _Optional[str] = ..., for_generators: _Optional[bool] = ...) -> None: ...

class ExportHfResponse(_message.Message):
    __slots__ = ("num_tensors",)
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    num_tensors: int
    def __init__(self, num_tensors: _Optional[int] = ...) -> None: ...

class ExportCudaIpcWeightsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ExportCudaIpcWeightsResponse(_message.Message):
    __slots__ = ("buckets", "num_bytes", "duration_ms")
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    buckets: _containers.RepeatedScalarFieldContainer[bytes]
    num_bytes: int
    duration_ms: int
    def __init__(self, buckets: _Optional[_Iterable[bytes]] = ..., num_bytes: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class ReleaseCudaIpcWeightsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ReleaseCudaIpcWeightsResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...
