from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_KIND_UNSPECIFIED: _ClassVar[ServiceKind]
    SERVICE_KIND_TRAINER: _ClassVar[ServiceKind]
    SERVICE_KIND_GENERATOR: _ClassVar[ServiceKind]
    SERVICE_KIND_REWARD: _ClassVar[ServiceKind]
    SERVICE_KIND_TEACHER: _ClassVar[ServiceKind]
    SERVICE_KIND_CRITIC: _ClassVar[ServiceKind]

class MemberHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_HEALTH_UNSPECIFIED: _ClassVar[MemberHealth]
    MEMBER_HEALTH_HEALTHY: _ClassVar[MemberHealth]
    MEMBER_HEALTH_LATE: _ClassVar[MemberHealth]
    MEMBER_HEALTH_LEAVING: _ClassVar[MemberHealth]
    MEMBER_HEALTH_STALE_WEIGHTS: _ClassVar[MemberHealth]
SERVICE_KIND_UNSPECIFIED: ServiceKind
SERVICE_KIND_TRAINER: ServiceKind
SERVICE_KIND_GENERATOR: ServiceKind
SERVICE_KIND_REWARD: ServiceKind
SERVICE_KIND_TEACHER: ServiceKind
SERVICE_KIND_CRITIC: ServiceKind
MEMBER_HEALTH_UNSPECIFIED: MemberHealth
MEMBER_HEALTH_HEALTHY: MemberHealth
MEMBER_HEALTH_LATE: MemberHealth
MEMBER_HEALTH_LEAVING: MemberHealth
MEMBER_HEALTH_STALE_WEIGHTS: MemberHealth

class RegisterRequest(_message.Message):
    __slots__ = ("kind", "address", "model_fingerprint", "capacity", "tasks", "pid", "shares_trainer_weights")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SHARES_TRAINER_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    kind: ServiceKind
    address: str
    model_fingerprint: str
    capacity: int
    tasks: _containers.RepeatedScalarFieldContainer[str]
    pid: int
    shares_trainer_weights: bool
    def __init__(self, kind: _Optional[_Union[ServiceKind, str]] = ..., address: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., capacity: _Optional[int] = ..., tasks: _Optional[_Iterable[str]] = ..., pid: _Optional[int] = ..., shares_trainer_weights: _Optional[bool] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("member_id", "heartbeat_interval_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    heartbeat_interval_ms: int
    def __init__(self, member_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("member_id", "num_inflight", "weight_version")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    num_inflight: int
    weight_version: int
    def __init__(self, member_id: _Optional[str] = ..., num_inflight: _Optional[int] = ..., weight_version: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known", "run_over")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    RUN_OVER_FIELD_NUMBER: _ClassVar[int]
    known: bool
    run_over: bool
    def __init__(self, known: _Optional[bool] = ..., run_over: _Optional[bool] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("member_id", "draining")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    draining: bool
    def __init__(self, member_id: _Optional[str] = ..., draining: _Optional[bool] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Member(_message.Message):
    __slots__ = ("member_id", "kind", "address", "weight_version", "num_inflight", "last_seen_ms_ago", "tasks", "capacity", "health", "pid")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    kind: ServiceKind
    address: str
    weight_version: int
    num_inflight: int
    last_seen_ms_ago: int
    tasks: _containers.RepeatedScalarFieldContainer[str]
    capacity: int
    health: MemberHealth
    pid: int
    def __init__(self, member_id: _Optional[str] = ..., kind: _Optional[_Union[ServiceKind, str]] = ..., address: _Optional[str] = ..., weight_version: _Optional[int] = ..., num_inflight: _Optional[int] = ..., last_seen_ms_ago: _Optional[int] = ..., tasks: _Optional[_Iterable[str]] = ..., capacity: _Optional[int] = ..., health: _Optional[_Union[MemberHealth, str]] = ..., pid: _Optional[int] = ...) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunStatusResponse(_message.Message):
    __slots__ = ("run_id", "phase", "step", "total_steps", "weight_version", "members", "last_metrics", "service_restarts")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ServiceRestartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    phase: str
    step: int
    total_steps: int
    weight_version: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    last_metrics: _containers.ScalarMap[str, float]
    service_restarts: _containers.ScalarMap[str, int]
    def __init__(self, run_id: _Optional[str] = ..., phase: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., weight_version: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., last_metrics: _Optional[_Mapping[str, float]] = ..., service_restarts: _Optional[_Mapping[str, int]] = ...) -> None: ...
