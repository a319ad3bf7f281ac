from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype", "bucket_index", "offset_bytes", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    bucket_index: int
    offset_bytes: int
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., bucket_index: _Optional[int] = ..., offset_bytes: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class BucketPlan(_message.Message):
    __slots__ = ("tensors", "bucket_sizes_bytes", "checksum_window_ends")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SIZES_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_WINDOW_ENDS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    bucket_sizes_bytes: _containers.RepeatedScalarFieldContainer[int]
    checksum_window_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., bucket_sizes_bytes: _Optional[_Iterable[int]] = ..., checksum_window_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class WeightSyncGroup(_message.Message):
    __slots__ = ("store_address", "epoch", "epoch_secret", "world_size", "op_timeout_ms")
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECRET_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    OP_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    store_address: str
    epoch: int
    epoch_secret: str
    world_size: int
    op_timeout_ms: int
    def __init__(self, store_address: _Optional[str] = ..., epoch: _Optional[int] = ..., epoch_secret: _Optional[str] = ..., world_size: _Optional[int] = ..., op_timeout_ms: _Optional[int] = ...) -> None: ...
