"""Property-based fuzzing of gRPC services (hypothesis), shared by tests/integration/test_fuzz_*.py.

`messages(descriptor)` draws any message of a protobuf type from its descriptor: every field
set or not, scalars from edge values (0, -1, limits, NaN, infinities, empty and oversized
strings) and from the whole range, repeated fields of any length, unknown enum numbers; a
field's strategy can be replaced by name (`overrides`) to aim at the values that reach deep code
(token ids near the vocabulary's end, paths under a scratch directory, short timeouts).

`Fuzzer` sends what the strategies draw to one server, each call with a deadline, and judges
the answers: the caller's mistakes must come back as a status that says so (INVALID_ARGUMENT,
FAILED_PRECONDITION, ...), never as INTERNAL or UNKNOWN (an unhandled error), a dropped
connection, or no answer within the deadline (a hang); a few calls carry a wrong token or
bytes that are not a message at all. It records every bad answer instead of stopping at the
first, so a run lists them all.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tandem.rpc import TOKEN_METADATA_KEY

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-2**63, 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
OVERSIZED = 2 << 20
"""Bytes of an oversized string or bytes field (well under the 256 MiB message limit)."""
OVERSIZED_TEXT, OVERSIZED_BYTES = "x" * OVERSIZED, b"\xff" * OVERSIZED
"""Made once: a fresh 2 MiB value per draw cost its copy and its hash each time (hypothesis hashes
what it draws), about half the time of drawing a message."""
ACCEPTED = frozenset({"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND", "OUT_OF_RANGE",
                      "ALREADY_EXISTS"})
"""Answers that say the request (or the service's state) was the problem."""


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (0, 1, -1, 2, 3, 7, 8, 64, 255, 256, 1024, 2**31 - 1, -2**31, 2**32 - 1, 2**62,
                                -2**62, lo, hi) if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(-8, 64).filter(lambda v: lo <= v <= hi),
                     st.integers(lo, hi))


def floats(width: int) -> st.SearchStrategy[float]:
    edges = [0.0, 1.0, -1.0, 0.5, 1e-9, 1e30, -1e30, math.nan, math.inf, -math.inf, 2.0]
    return st.one_of(st.sampled_from(edges), st.floats(-4, 4, width=width),
                     st.floats(width=width, allow_nan=True, allow_infinity=True))


def texts() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(["", "a", "arithmetic", "../../etc/passwd", "\x00", "💥" * 3, " "]),
                     st.text(max_size=24), st.just(OVERSIZED_TEXT))


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy:
    if fd.type in _INT_RANGES:
        return integers(*_INT_RANGES[fd.type])
    if fd.type == FieldDescriptor.TYPE_DOUBLE:
        return floats(64)
    if fd.type == FieldDescriptor.TYPE_FLOAT:
        return floats(32)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if fd.type == FieldDescriptor.TYPE_STRING:
        return texts()
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(OVERSIZED_BYTES))
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in fd.enum_type.values]), st.integers(-3, 50))
    raise TypeError(f"no strategy for field {fd.full_name}")


def messages(descriptor: Descriptor, message_type: type[Message] | None = None, *,
             overrides: dict[str, st.SearchStrategy] | None = None, depth: int = 3,
             max_repeated: int = 6) -> st.SearchStrategy[Message]:
    """Any `message_type` message (the descriptor's class by default); `overrides` replaces the
    strategy of a field by its name (wherever the field is, nested messages included). Each
    field's strategy is built here, once, not at every draw."""
    from google.protobuf import message_factory

    overrides = overrides or {}
    cls = message_type or message_factory.GetMessageClass(descriptor)
    fields = [(fd, strategy) for fd in descriptor.fields
              if (strategy := _field(fd, overrides, depth, max_repeated)) is not None]

    @st.composite
    def build(draw) -> Message:
        message = cls()
        for fd, strategy in fields:
            if draw(st.booleans()):
                _set(message, fd, draw(strategy))
        return message
    return build()


def _value(fd: FieldDescriptor, overrides, depth: int, max_repeated: int) -> st.SearchStrategy:
    if fd.name in overrides:
        return overrides[fd.name]
    if fd.message_type is not None:
        return messages(fd.message_type, overrides=overrides, depth=depth - 1, max_repeated=max_repeated)
    return _scalar(fd)


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _field(fd: FieldDescriptor, overrides, depth: int, max_repeated: int) -> st.SearchStrategy | None:
    """What a field of a drawn message holds (None: the field stays unset, a message below `depth`)."""
    if _is_map(fd):
        key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        return st.dictionaries(_scalar(key_fd), _value(value_fd, overrides, depth, max_repeated), max_size=3)
    if fd.message_type is not None and depth <= 0 and fd.name not in overrides:
        return None
    strategy = _value(fd, overrides, depth, max_repeated)
    return st.lists(strategy, max_size=max_repeated) if fd.is_repeated and fd.name not in overrides else strategy


def _set(message: Message, fd: FieldDescriptor, values) -> None:
    if _is_map(fd):
        target = getattr(message, fd.name)
        for key, value in values.items():
            if fd.message_type.fields_by_name["value"].message_type is not None:
                target[key].CopyFrom(value)
            else:
                target[key] = value
    elif fd.is_repeated:
        getattr(message, fd.name).extend(values)
    elif fd.message_type is not None:
        getattr(message, fd.name).CopyFrom(values)
    else:
        setattr(message, fd.name, values)


def mutated(base: Message, *, overrides: dict[str, st.SearchStrategy] | None = None,
            max_changes: int = 2) -> st.SearchStrategy[Message]:
    """A valid `base` message with up to `max_changes` of its scalar fields set to drawn values:
    requests that pass the first checks and reach the code behind them."""
    overrides = overrides or {}
    scalars = [fd for fd in base.DESCRIPTOR.fields if fd.message_type is None]

    @st.composite
    def build(draw) -> Message:
        message = type(base)()
        message.CopyFrom(base)
        for _ in range(draw(st.integers(0, max_changes))):
            fd = draw(st.sampled_from(scalars))
            strategy = overrides.get(fd.name, _scalar(fd))
            if fd.is_repeated:
                del getattr(message, fd.name)[:]
                getattr(message, fd.name).extend(draw(strategy if fd.name in overrides else st.lists(strategy,
                                                                                                      max_size=8)))
            else:
                setattr(message, fd.name, draw(strategy))
        return message
    return build()


@dataclass
class Fuzzer:
    """Sends drawn requests to one server and judges the answers."""

    address: str
    token: str
    service: str
    deadline_s: float = 20.0
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    """(method, status, the first words of the details): what the answers said, for a reader."""
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0

    def __post_init__(self) -> None:
        self._channel = grpc.insecure_channel(self.address, options=[("grpc.max_send_message_length", 256 << 20),
                                                                     ("grpc.max_receive_message_length", 256 << 20)])

    def close(self) -> None:
        self._channel.close()

    def call(self, method: str, request: bytes, *, stream: bool = False, token: str | None = None) -> str:
        """One call (raw bytes in); returns the status name, recording a failure if it is not accepted."""
        path = f"/{self.service}/{method}"
        metadata = [(TOKEN_METADATA_KEY, self.token if token is None else token)]
        started = time.monotonic()
        try:
            if stream:
                for _ in self._channel.unary_stream(path)(request, metadata=metadata, timeout=self.deadline_s):
                    pass
            else:
                self._channel.unary_unary(path)(request, metadata=metadata, timeout=self.deadline_s)
            code, details = "OK", ""
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        elapsed = time.monotonic() - started
        self.sent += 1
        self.slowest_s = max(self.slowest_s, elapsed)
        self.statuses[code] += 1
        self.reasons[(method, code, " ".join(details.split()[:6]))] += 1
        if not self._acceptable(code, details, elapsed, token):
            self.failures.append(f"{method}: {code} after {elapsed:.2f}s: {details[:300]} <- {request[:200]!r}")
        return code

    def _acceptable(self, code: str, details: str, elapsed: float, token: str | None) -> bool:
        if token is not None and token != self.token:
            return code == "UNAUTHENTICATED"
        if code in ACCEPTED:
            return True
        if code == "DEADLINE_EXCEEDED":  # the server's own bounded wait (a peer that never came), not a hang
            return elapsed < self.deadline_s * 0.9 and details.startswith(("TimeoutError", "DeadlineExceeded"))
        return code == "UNAVAILABLE" and details.startswith("ConnectionError")  # a peer it was pointed at is gone

    def fuzz(self, method: str, strategy: st.SearchStrategy[Message], count: int, *, stream: bool = False,
             seed_calls: Callable[[], None] | None = None) -> None:
        """`count` drawn requests to `method` (a few with a wrong token, a few as garbage bytes)."""
        garbage = st.binary(min_size=1, max_size=64)
        turn = iter(range(count * 10))

        @settings(max_examples=count, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy, garbage)
        def one(request: Message, junk: bytes) -> None:
            kind = next(turn) % 40  # 1 in 40 with a wrong token, 1 in 40 as bytes that are no message
            if kind == 0:
                self.call(method, request.SerializeToString(), stream=stream, token="wrong-token")
            elif kind == 1:
                self.call(method, junk, stream=stream)
            else:
                self.call(method, request.SerializeToString(), stream=stream)
        if seed_calls is not None:
            seed_calls()
        one()

    def report(self) -> str:
        """Counts and statuses; with TANDEM_FUZZ_REASONS=1, every (method, status, reason) too."""
        text = (f"{self.service}: {self.sent} messages, slowest {self.slowest_s:.2f}s, "
                f"statuses {dict(sorted(self.statuses.items()))}")
        if os.environ.get("TANDEM_FUZZ_REASONS"):
            text += "".join(f"\n  {n:5d} {m} {c} {d}" for (m, c, d), n in sorted(self.reasons.items()))
        return text
