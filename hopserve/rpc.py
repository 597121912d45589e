"""The gRPC edge shared by the front-end and the worker: safe request decoding, bounded text.

grpc runs a method's request deserializer before the servicer, and a deserializer that
raises is answered by grpc itself (``UNKNOWN`` on grpc.aio, ``INTERNAL`` on the sync
server) with a traceback in the log. :func:`add_service` registers a servicer with
handlers whose deserializers never raise: bytes that are not a valid message become an
:class:`UndecodableRequest`, which the handler answers with ``INVALID_ARGUMENT`` (naming
the message type, the byte count and protobuf's reason) before the servicer runs.

Client-supplied text that goes back into a status message or a log line passes through
:func:`quote` (at most :data:`MAX_QUOTED_CHARS` characters of it, control characters
escaped, plus its size; :func:`clip` leaves short printable ids such as job ids bare); a
whole status message through :func:`bound_message` (at most :data:`MAX_STATUS_BYTES`
UTF-8 bytes), so that an answer always fits gRPC's metadata limit.
Imports grpc, protobuf, :mod:`hopserve.logs` and :mod:`hopserve.security` only (no torch).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from hopserve.logs import rate_limited
from hopserve.security.gate import Denial, Gate

__all__ = [
    "MAX_QUOTED_CHARS",
    "MAX_STATUS_BYTES",
    "UndecodableRequest",
    "add_service",
    "bind_port",
    "bound_message",
    "clip",
    "quote",
    "safe_deserializer",
]

logger = rate_limited(__name__)

MAX_QUOTED_CHARS = 64
"""How many characters of a client-supplied value :func:`quote` keeps."""

MAX_STATUS_BYTES = 1024
"""Upper bound of a status message in UTF-8 bytes (grpc's default metadata limit is 8 KiB
and ``grpc-message`` percent-encodes every non-ASCII byte into three)."""

_TRUNCATED = "…"

# grpc's own loggers that report a failing handler; rate-limited by add_service.
_GRPC_LOGGERS = ("grpc._cython.cygrpc", "grpc._server", "grpc.aio._server")


def quote(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """``repr`` of a client-supplied value, cut to ``limit`` characters of it.

    A longer value reads ``'abc…'…(100000 bytes)`` (its UTF-8 size); control and other
    non-printable characters are escaped by ``repr``. Non-strings are quoted as their
    ``str``.
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    size = len(text.encode("utf-8", "surrogatepass"))
    return f"{text[:limit]!r}{_TRUNCATED}({size} bytes)"


def clip(value: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``value`` itself when it is short and printable (e.g. a job id), else
    :func:`quote` of it."""
    return value if len(value) <= limit and value.isprintable() else quote(value, limit)


def bound_message(message: str, limit: int = MAX_STATUS_BYTES) -> str:
    """``message`` if it has at most ``limit`` UTF-8 bytes, else its longest prefix that
    fits together with a ``…(truncated, N bytes)`` marker."""
    data = message.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return message
    marker = f"{_TRUNCATED}(truncated, {len(data)} bytes)"
    keep = max(0, limit - len(marker.encode("utf-8")))
    return data[:keep].decode("utf-8", "ignore") + marker


def bind_port(
    server: grpc.Server | grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[int, str]:
    """Bind ``host:port`` (IPv6 hosts bracketed), TLS when ``credentials`` are given. A
    ``host`` of ``"unix:PATH"`` binds that Unix domain socket (``port`` is ignored).

    Returns:
        ``(bound port, address)``; the port is 0 when it could not be bound (in use).
    """
    if host.startswith("unix:"):
        address = host
    elif ":" in host and not host.startswith("["):
        address = f"[{host}]:{port}"
    else:
        address = f"{host}:{port}"
    try:
        if credentials is None:
            return server.add_insecure_port(address), address
        return server.add_secure_port(address, credentials), address
    except RuntimeError as err:  # grpc's "Failed to bind"
        logger.debug("bind %s: %s", address, err)
        return 0, address


@dataclass(frozen=True)
class UndecodableRequest:
    """Stands in for a request whose bytes are not a valid ``message_type``."""

    message_type: str  # full protobuf name, e.g. "hopserve.v1.GetEmbeddingsRequest"
    size: int  # bytes received
    reason: str  # protobuf's error, e.g. "String field had bad UTF-8"

    def describe(self) -> str:
        """The client-facing status message."""
        return bound_message(
            f"the request is not a valid {self.message_type} ({self.size} bytes): {self.reason}"
        )


def safe_deserializer(cls: type[Message]) -> Callable[[bytes], Message | UndecodableRequest]:
    """``cls.FromString`` that returns an :class:`UndecodableRequest` instead of raising."""
    full_name = cls.DESCRIPTOR.full_name
    prefix = f"Error parsing message with type '{full_name}': "

    def deserialize(data: bytes) -> Message | UndecodableRequest:
        try:
            return cls.FromString(data)
        except Exception as err:  # DecodeError; anything protobuf raises on hostile bytes
            reason = str(err).removeprefix(prefix) or type(err).__name__
            return UndecodableRequest(full_name, len(data), bound_message(reason, 200))

    return deserialize


Rejected = Callable[[str, UndecodableRequest], None]
"""``on_undecodable(method_name, request)``: called before the INVALID_ARGUMENT answer."""


def add_service(
    server: grpc.Server | grpc.aio.Server,
    servicer: object,
    service: ServiceDescriptor,
    *,
    on_undecodable: Rejected | None = None,
    gate: Gate | None = None,
) -> None:
    """Register ``servicer`` for every method of ``service`` on ``server``.

    Does what the generated ``add_<Service>Servicer_to_server`` does (generic and
    registered method handlers), with :func:`safe_deserializer` request deserializers:
    undecodable bytes are answered ``INVALID_ARGUMENT`` and never reach the servicer.
    With a ``gate`` every call passes :meth:`Gate.check` first (tokens, scopes, rate
    limits), before its bytes are even looked at.
    Works for grpc.aio (coroutine / async-generator methods) and sync servers; methods
    with a request stream are not supported.

    Raises:
        ValueError: a method of ``service`` takes a request stream.
    """
    aio = isinstance(server, grpc.aio.Server)
    handlers = {}
    for method in service.methods:
        if method.client_streaming:
            raise ValueError(f"{method.full_name}: request streams are not supported")
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        behavior = getattr(servicer, method.name)
        wrapped = _guard(method, behavior, aio, on_undecodable, gate)
        factory = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = factory(
            wrapped,
            request_deserializer=safe_deserializer(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
    for name in _GRPC_LOGGERS:
        rate_limited(name)


def _guard(
    method: MethodDescriptor,
    behavior: Callable[..., Any],
    aio: bool,
    on_undecodable: Rejected | None,
    gate: Gate | None,
) -> Callable[..., Any]:
    """``behavior`` preceded by the gate's check and the INVALID_ARGUMENT answer to an
    undecodable request."""
    name = method.name
    full_name = f"/{method.containing_service.full_name}/{name}"

    def denied(context: Any) -> Denial | None:
        if gate is None or not gate.enabled:  # no tokens, no limit: nothing to look at
            return None
        denial = gate.check(full_name, context.invocation_metadata(), context.peer())
        if denial is not None:
            logger.debug("%s from %s refused: %s", name, context.peer(), denial.message)
        return denial

    def rejected(request: UndecodableRequest, context: Any) -> str:
        logger.debug("%s: undecodable request from %s: %s", name, context.peer(), request)
        if on_undecodable is not None:
            try:
                on_undecodable(name, request)
            except Exception:  # a metrics hook must not change the answer
                logger.warning("%s: on_undecodable hook failed", name, exc_info=True)
        return request.describe()

    if aio and method.server_streaming:
        if not inspect.isasyncgenfunction(behavior):
            raise ValueError(f"{method.full_name}: expected an async generator method")

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if denial := denied(context):
                await _abort_aio(context, denial)
            if isinstance(request, UndecodableRequest):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, rejected(request, context))
            inner = behavior(request, context)
            try:
                async for item in inner:
                    yield item
            finally:
                await inner.aclose()

        return stream
    if aio:

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if denial := denied(context):
                await _abort_aio(context, denial)
            if isinstance(request, UndecodableRequest):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, rejected(request, context))
            return await behavior(request, context)

        return unary

    def sync(request: Any, context: grpc.ServicerContext) -> Any | Iterator[Any]:
        if denial := denied(context):
            context.set_trailing_metadata(denial.trailing_metadata)
            context.abort(denial.code, denial.message)
        if isinstance(request, UndecodableRequest):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, rejected(request, context))
        return behavior(request, context)

    return sync


async def _abort_aio(context: grpc.aio.ServicerContext, denial: Denial) -> None:
    await context.abort(denial.code, denial.message, trailing_metadata=denial.trailing_metadata)
