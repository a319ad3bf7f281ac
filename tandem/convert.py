"""Proto <-> plain-type conversion shared by every server.py and client.py.

Two kinds of helpers:
- generic ones driven by the message descriptors, so no service writes a field list or an
  enum table by hand: `enum_to_pb` / `enum_from_pb` map a lowercase name ("k3", "seq-mask-tis",
  "kv_cache") to the enum value that buf's naming rule gives it (`KL_TYPE_K3`: the enum's name
  in SCREAMING_SNAKE_CASE, then the name upper-cased, '-' as '_'); `to_pb` / `from_pb` copy the
  fields two types share by name (optional fields left unset mean the plain type's default);
- the shared weight-sync messages (tandem.common.v1) and `tandem.weight_sync`'s dataclasses.

Domain code never sees a protobuf message.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from protos.tandem.common.v1 import common_pb2
from tandem.weight_plan import BucketPlan, GroupSpec, TensorSpec

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _prefix(enum: EnumDescriptor) -> str:
    return _CAMEL_BOUNDARY.sub("_", enum.name).upper() + "_"


def enum_to_pb(enum: EnumDescriptor, name: str) -> int:
    """The number of `name` ("seq-mask-tis") in `enum` (TRUNCATED_IMPORTANCE_SAMPLING_TYPE_SEQ_MASK_TIS)."""
    value = enum.values_by_name.get(_prefix(enum) + name.upper().replace("-", "_"))
    if value is None or value.number == 0:
        raise ValueError(f"{name!r} is not a {enum.name}: use one of {enum_names(enum)}")
    return value.number


def enum_from_pb(enum: EnumDescriptor, number: int) -> str | None:
    """The lowercase name of `number` in `enum`; None for the UNSPECIFIED value. ValueError
    for a number the contract does not define."""
    value = enum.values_by_number.get(number)
    if value is None:
        raise ValueError(f"{number} is not a {enum.name}: use one of {enum_names(enum)}")
    return None if number == 0 else value.name.removeprefix(_prefix(enum)).lower()


def enum_names(enum: EnumDescriptor) -> list[str]:
    """The lowercase names of `enum`'s values, UNSPECIFIED left out ('_' where the domain says '-'
    is not recoverable from the proto, so callers compare through enum_to_pb)."""
    return [v.name.removeprefix(_prefix(enum)).lower() for v in enum.values if v.number != 0]


def to_pb(message_type: type[Message], values: Mapping[str, Any] | Any, **extra: Any) -> Message:
    """A `message_type` holding the fields of `values` (a mapping, or an object with attributes)
    that the message declares, plus `extra`; None leaves a field unset, enums go by name."""
    message = message_type()
    for field in message_type.DESCRIPTOR.fields:
        value = extra.get(field.name) if field.name in extra else _read(values, field.name)
        if value is None:
            continue
        if field.enum_type is not None:
            value = ([enum_to_pb(field.enum_type, v) for v in value] if _repeated(field)
                     else enum_to_pb(field.enum_type, value))
        if _repeated(field):
            getattr(message, field.name).extend(value)
        elif field.message_type is not None:
            getattr(message, field.name).CopyFrom(value)
        else:
            setattr(message, field.name, value)
    return message


def from_pb(message: Message, target: type | None = None, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of `message` as plain values, for the constructor of `target`: an unset optional
    field is None where `target` admits None for it (null means "off" there, whatever the
    default), else left out like an UNSPECIFIED enum (the type's default applies); enums come
    back by name, spelled as `target`'s Literal annotation spells them ("seq-mask-tis" for
    SEQ_MASK_TIS); repeated fields as tuples; nested messages are not converted (skip them)."""
    hints = typing.get_type_hints(target) if target is not None else {}
    spellings = _literal_spellings(hints)
    values: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.name in skip:
            continue
        if field.message_type is not None:
            raise TypeError(f"{message.DESCRIPTOR.name}.{field.name} is a message: convert it by hand or skip it")
        if field.has_presence and not _repeated(field) and not message.HasField(field.name):
            if type(None) in _flatten(hints.get(field.name)):
                values[field.name] = None
            continue
        value = getattr(message, field.name)
        if field.enum_type is not None:
            spell = spellings.get(field.name, {})
            if _repeated(field):
                value = tuple(spell.get(n, n) for n in (enum_from_pb(field.enum_type, v) for v in value))
            else:
                value = enum_from_pb(field.enum_type, value)
                if value is None:
                    continue
                value = spell.get(value, value)
        elif _repeated(field):
            value = tuple(value)
        values[field.name] = value
    return values


def _literal_spellings(hints: dict[str, Any]) -> dict[str, dict[str, str]]:
    """field -> {enum_from_pb's name: the Literal value it stands for}, from a type's annotations."""
    spellings: dict[str, dict[str, str]] = {}
    for name, annotation in hints.items():
        choices = [a for a in _flatten(annotation) if isinstance(a, str)]
        if choices:
            spellings[name] = {c.replace("-", "_"): c for c in choices}
    return spellings


def _flatten(annotation: Any) -> list[Any]:
    """The leaves of a Literal / Union / tuple annotation."""
    args = typing.get_args(annotation)
    return [leaf for arg in args for leaf in _flatten(arg)] if args else [annotation]


def _read(values: Mapping[str, Any] | Any, name: str) -> Any:
    return values.get(name) if isinstance(values, Mapping) else getattr(values, name, None)


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


# ----------------------------------------------------------------------------- weight sync


def plan_to_pb(plan: BucketPlan) -> common_pb2.BucketPlan:
    return common_pb2.BucketPlan(tensors=[to_pb(common_pb2.TensorSpec, t) for t in plan.tensors],
                                 bucket_sizes_bytes=list(plan.bucket_sizes_bytes),
                                 checksum_window_ends=list(plan.window_ends))


def plan_from_pb(pb: common_pb2.BucketPlan) -> BucketPlan:
    return BucketPlan(tuple(TensorSpec(**from_pb(t)) for t in pb.tensors), tuple(pb.bucket_sizes_bytes),
                      tuple(pb.checksum_window_ends))


def group_to_pb(group: GroupSpec) -> common_pb2.WeightSyncGroup:
    return to_pb(common_pb2.WeightSyncGroup, group, op_timeout_ms=int(group.op_timeout_s * 1000))


MAX_GROUP_SIZE = 1 << 16
MAX_OP_TIMEOUT_MS = 3_600_000


def group_from_pb(pb: common_pb2.WeightSyncGroup) -> GroupSpec:
    if not pb.store_address or pb.world_size < 1:  # 1: the trainer alone (a publish with nothing to send)
        raise ValueError("weight-sync group needs a store address and at least 1 member (the trainer)")
    if pb.world_size > MAX_GROUP_SIZE or not 0 <= pb.op_timeout_ms <= MAX_OP_TIMEOUT_MS or pb.epoch < 0:
        raise ValueError(f"weight-sync group out of range: world_size {pb.world_size} (at most {MAX_GROUP_SIZE}), "
                         f"op_timeout_ms {pb.op_timeout_ms} (0 for the default, at most {MAX_OP_TIMEOUT_MS}), "
                         f"epoch {pb.epoch} (not negative)")
    return GroupSpec(pb.store_address, pb.epoch, pb.epoch_secret, pb.world_size,
                     (pb.op_timeout_ms or 30_000) / 1000)
