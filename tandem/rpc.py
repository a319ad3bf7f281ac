"""gRPC bootstrap shared by every Tandem service and client.

Servers are `grpc.aio`; each one gets, in this order:
- an auth interceptor: every call must carry the shared token in the `x-tandem-token`
  metadata, except the standard health check (so orchestrators can probe liveness);
- an error interceptor: the one place where exceptions become status codes (it also parses
  the request, so bytes that are not the method's message are INVALID_ARGUMENT)
  (ValueError -> INVALID_ARGUMENT, FailedPrecondition -> FAILED_PRECONDITION,
  TimeoutError -> DEADLINE_EXCEEDED, ConnectionError -> UNAVAILABLE, else INTERNAL);
- `grpc.health.v1` and reflection, so `grpcurl` works against it. Health of each named service
  and of the whole server ("") is NOT_SERVING until the service calls `mark_ready` (its model
  or engine is loaded), and again whenever it calls `mark_not_serving` (draining, stopping, or
  weights in an unknown state): a probe of "" never says SERVING for a server still loading.

Clients are synchronous channels that attach the token; every stub call in the typed
clients passes a deadline (`timeout=`), and a failed call raises `RpcFailure` (the typed clients'
methods are wrapped in `rpc_failures`), so the code that calls them never imports grpc.
"""

from __future__ import annotations

import functools
import hmac
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

TOKEN_METADATA_KEY = "x-tandem-token"
TOKEN_ENV = "TANDEM_TOKEN"
TOKEN_FILE_ENV = "TANDEM_TOKEN_FILE"
HEALTH_SERVICE = "grpc.health.v1.Health"
# 256 MiB: batches of token ids can exceed gRPC's 4 MiB default; weights never travel here.
MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]
"""gRPC binds with SO_REUSEPORT by default: a second server on a port another process holds would
bind too, and the kernel would split new connections between them. A held port is an error."""


class FailedPrecondition(RuntimeError):
    """The call is valid but the service is not in a state to run it (e.g. model not loaded)."""


class TokenMissing(ValueError):
    """No shared token was configured."""


def load_token(env: dict[str, str] | None = None) -> str:
    """The shared token, from TANDEM_TOKEN or the file named by TANDEM_TOKEN_FILE."""
    env = os.environ if env is None else env
    if env.get(TOKEN_ENV):
        return env[TOKEN_ENV]
    if env.get(TOKEN_FILE_ENV):
        token = Path(env[TOKEN_FILE_ENV]).read_text().strip()
        if token:
            return token
        raise TokenMissing(f"{TOKEN_FILE_ENV}={env[TOKEN_FILE_ENV]} is empty")
    raise TokenMissing(f"no shared token: set {TOKEN_ENV} or {TOKEN_FILE_ENV} (every Tandem RPC carries it)")


class Status(str, Enum):
    """A call's gRPC status code, by name (what `RpcFailure` carries)."""

    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"

    @property
    def rejects_request(self) -> bool:
        """The service refused the request itself: sending it to another one, or again, cannot help."""
        return self in _REQUEST_ERRORS

    @property
    def unreachable(self) -> bool:
        """The service could not be reached or did not answer in time (it may be dead)."""
        return self in _UNREACHABLE

    @property
    def retryable(self) -> bool:
        """Worth retrying, on the same service or another one serving the same thing."""
        return self in _UNREACHABLE or self is Status.ABORTED


_REQUEST_ERRORS = frozenset({Status.INVALID_ARGUMENT, Status.UNAUTHENTICATED, Status.PERMISSION_DENIED,
                             Status.UNIMPLEMENTED})
_UNREACHABLE = frozenset({Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.CANCELLED})


class RpcFailure(Exception):
    """A call to another service failed: its status and the server's details."""

    def __init__(self, status: Status, details: str):
        super().__init__(f"{status.name}: {details}")
        self.status = status
        self.details = details


def _failure(exc: grpc.RpcError, waited_for: str = "") -> RpcFailure:
    """waited_for: the call, named in the details of an expired deadline (gRPC says only
    "Deadline Exceeded", which does not tell a hung trainer from a hung reward service)."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    status = Status.__members__.get(code.name if code is not None else "UNKNOWN", Status.UNKNOWN)
    if status is Status.DEADLINE_EXCEEDED and waited_for:
        details = f"{details or 'Deadline Exceeded'} (waiting for {waited_for})"
    return RpcFailure(status, details or "")


def _call_name(method, args) -> str:
    """`Client.method at host:port` for a typed client's method (its first argument)."""
    owner = args[0] if args else None
    address = getattr(owner, "address", None)
    name = f"{type(owner).__name__}.{method.__name__}" if owner is not None else method.__name__
    return f"{name} at {address}" if isinstance(address, str) else name


def rpc_failures(method):
    """Decorator of a typed client's methods: a grpc.RpcError (from a call, or while iterating a
    stream) becomes an RpcFailure; an expired deadline names the call and the server's address."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(*args, **kwargs):
            try:
                yield from method(*args, **kwargs)
            except grpc.RpcError as exc:
                raise _failure(exc, _call_name(method, args)) from exc
        return stream

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except grpc.RpcError as exc:
            raise _failure(exc, _call_name(method, args)) from exc
    return call


# ----------------------------------------------------------------------------- server side


def _abort_handler(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, details)

    return grpc.unary_unary_rpc_method_handler(abort)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses any call without the shared token (health checks excepted)."""

    def __init__(self, token: str):
        self._token = token.encode()

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(f"/{HEALTH_SERVICE}/"):
            return await continuation(handler_call_details)
        presented = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA_KEY, "")
        if not hmac.compare_digest(str(presented).encode(), self._token):
            return _abort_handler(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong {TOKEN_METADATA_KEY}")
        return await continuation(handler_call_details)


def status_for(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, FailedPrecondition):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, ConnectionError):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by servicers to status codes, with the message as details."""

    def __init__(self, log: Any):
        self._log = log

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(f"/{HEALTH_SERVICE}/"):
            return handler
        method, log = handler_call_details.method, self._log

        async def _fail(exc: Exception, context: grpc.aio.ServicerContext) -> None:
            code, details = status_for(exc), _details(exc)
            log.warning("rpc_failed", method=method, code=code.name, error=details,
                        exc_info=code == grpc.StatusCode.INTERNAL)
            await context.abort(code, details)

        parse = _parser(handler.request_deserializer, method)  # a malformed request is the caller's fault

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary_unary(raw, context):
                try:
                    return await inner(parse(raw), context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:  # the one broad except of the server: map to a status
                    await _fail(exc, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, None, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def unary_stream(raw, context):
                try:
                    async for item in inner_stream(parse(raw), context):
                        yield item
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _fail(exc, context)

            return grpc.unary_stream_rpc_method_handler(unary_stream, None, handler.response_serializer)
        return handler


MAX_DETAILS_CHARS = 4000
"""Status details travel as trailing metadata (16 KiB at most): a message that quotes a huge
input is cut, or the caller would get RESOURCE_EXHAUSTED instead of the status it was sent."""


def _details(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) <= MAX_DETAILS_CHARS:
        return text
    return f"{text[:MAX_DETAILS_CHARS]}... ({len(text) - MAX_DETAILS_CHARS} more characters)"


def _parser(deserialize: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    """The request deserializer, raising ValueError (INVALID_ARGUMENT) for bytes that are not the
    method's message (gRPC itself would answer UNKNOWN)."""
    if deserialize is None:
        return lambda raw: raw

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            raise ValueError(f"the request is not a valid message of {method} ({exc})") from None
    return parse


@dataclass
class RunningServer:
    """A started aio server with its bound port and health servicer."""

    server: grpc.aio.Server
    port: int
    host: str
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]
    token: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def mark_ready(self) -> None:
        """Every named service and the whole server ("") SERVING."""
        for name in ("", *self.service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def mark_not_serving(self) -> None:
        for name in ("", *self.service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.mark_not_serving()
        await self.server.stop(grace_s)


async def start_server(
    register: Iterable[Callable[[grpc.aio.Server], None]],
    service_names: Iterable[str],
    *,
    host: str,
    port: int,
    token: str,
    log: Any,
) -> RunningServer:
    """Start an aio server on host:port (0 = any free port). Health ("" and each named service)
    is NOT_SERVING until mark_ready."""
    server = grpc.aio.server(interceptors=[AuthInterceptor(token), ErrorInterceptor(log)], options=SERVER_OPTIONS)
    for add in register:
        add(server)
    names = tuple(service_names)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*names, HEALTH_SERVICE, reflection.SERVICE_NAME), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio raises this where older versions returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"could not listen on {host}:{port}: the port is taken (another process holds it) or the "
                      "address is not this host's")
    for name in ("", *names):  # before the port answers: no probe ever sees SERVING too early
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    log.info("grpc_listening", address=f"{host}:{bound}", services=list(names))
    return RunningServer(server, bound, host, health_servicer, names, token)


# ----------------------------------------------------------------------------- client side


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self._metadata = ((TOKEN_METADATA_KEY, token),)

    def _with_token(self, details):
        metadata = tuple(details.metadata or ()) + self._metadata
        return _ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                  details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)


@dataclass(frozen=True)
class _ClientCallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: tuple
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


def open_channel(address: str, token: str | None) -> grpc.Channel:
    """A channel to address that attaches the token (None: no token, for tests of refusal)."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return channel if token is None else grpc.intercept_channel(channel, _TokenInterceptor(token))


def check_health(address: str, service: str = "", timeout_s: float = 2.0) -> bool:
    """True if `service` at address reports SERVING (no token needed)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


AsyncHandler = Callable[..., Awaitable[Any]]
