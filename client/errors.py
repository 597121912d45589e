"""Typed client exceptions: one base carrying the gRPC status, one subclass per status.

Every :class:`grpc.RpcError` raised by a call is converted by :func:`from_rpc_error` and
re-raised with ``raise ... from None``; no gRPC exception leaves the client.
"""

from __future__ import annotations

import grpc

__all__ = [
    "DeadlineExceededError",
    "HopserveError",
    "InvalidArgumentError",
    "MalformedResponseError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "from_rpc_error",
]


class HopserveError(Exception):
    """A failed hopserve call.

    Attributes:
        code: The gRPC status of the failure (for client-side failures, the status the
            server would have answered).
        details: The server's status message (or the client's, for failures detected
            client-side); names the offending value where there is one.
        rpc: The call that failed, e.g. ``"GetEmbeddings"``; empty if none was sent.
    """

    #: Status used when an instance is created without an explicit ``code``.
    default_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None, rpc: str = "") -> None:
        self.code: grpc.StatusCode = code if code is not None else self.default_code
        self.details: str = details
        self.rpc: str = rpc
        super().__init__(details)

    def __str__(self) -> str:
        where = f"{self.rpc}: " if self.rpc else ""
        return f"[{self.code.name}] {where}{self.details}"

    def __reduce__(self) -> tuple[type, tuple[str, grpc.StatusCode, str]]:
        return type(self), (self.details, self.code, self.rpc)


class InvalidArgumentError(HopserveError, ValueError):
    """The request is malformed (INVALID_ARGUMENT / OUT_OF_RANGE); fix it, don't retry.

    Also raised by client-side validation, before anything is sent; it is a
    :class:`ValueError` too.
    """

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(HopserveError):
    """The model (or model version) is not served (NOT_FOUND)."""

    default_code = grpc.StatusCode.NOT_FOUND


class UnavailableError(HopserveError):
    """The server could not be reached or is not ready (UNAVAILABLE); retried already."""

    default_code = grpc.StatusCode.UNAVAILABLE


class ResourceExhaustedError(HopserveError):
    """The server shed load (RESOURCE_EXHAUSTED) on every attempt; retried already."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnauthenticatedError(HopserveError):
    """No token, or one the server does not accept (UNAUTHENTICATED)."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(HopserveError):
    """The token lacks the scope the call needs (PERMISSION_DENIED)."""

    default_code = grpc.StatusCode.PERMISSION_DENIED


class DeadlineExceededError(HopserveError, TimeoutError):
    """The call's deadline passed (DEADLINE_EXCEEDED); also a :class:`TimeoutError`."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class MalformedResponseError(HopserveError):
    """The server's answer broke the wire contract (wrong size, dtype, order, ...)."""

    default_code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[HopserveError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def rpc_status(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """``(code, details)`` of a sync or asyncio gRPC error (UNKNOWN if it has none)."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else None
    return code or grpc.StatusCode.UNKNOWN, details or str(err)


def from_rpc_error(err: grpc.RpcError, rpc: str = "") -> HopserveError:
    """Convert a gRPC error into the matching :class:`HopserveError` subclass.

    Args:
        err: The error raised by a sync or asyncio gRPC call.
        rpc: The failed call for messages, e.g. ``"GetEmbeddings"``.
    """
    code, details = rpc_status(err)
    return _BY_CODE.get(code, HopserveError)(details, code, rpc)
