"""Front-end errors and the one table mapping every error to a gRPC status.

Code inside the front-end raises the :class:`ServiceError` subclasses below (or lets
worker and graph-store errors propagate); the servicer turns any exception into a status
with :func:`to_status`, once, at the edge. Messages of :class:`ServiceError` are written
for the client and name the bad value; any other exception becomes INTERNAL with a short
message carrying a reference id, and its traceback is logged under that id.

=================================  ======================  ===============================
error                              status                  when
=================================  ======================  ===============================
:class:`ModelNotFoundError`        NOT_FOUND               unknown model name or version
:class:`InvalidRequestError`       INVALID_ARGUMENT        empty / too many / unknown IDs,
                                                           bad fanouts, bad options
``UnknownNodeError`` (graph)       INVALID_ARGUMENT        unknown external node IDs
:class:`ModelNotReadyError`        UNAVAILABLE             model still loading or failed
:class:`ShuttingDownError`         UNAVAILABLE             server is stopping
``WorkerUnavailableError``         UNAVAILABLE             no worker can take the job
worker ``ModelNotFoundError``      UNAVAILABLE             the worker lost the model
worker ``GraphVersionMismatch…``   UNAVAILABLE             the worker serves another graph
:class:`QueueFullError`            RESOURCE_EXHAUSTED      the model's batcher queue is full
worker ``WorkerBusyError``         RESOURCE_EXHAUSTED      every worker's queue is full
:class:`DeadlineExceededError`     DEADLINE_EXCEEDED       deadline passed (queued or running)
worker ``DeadlineExceededError``   DEADLINE_EXCEEDED       the job's deadline passed
``TimeoutError``                   DEADLINE_EXCEEDED       an awaited step timed out
:class:`RequestCancelledError`     CANCELLED               the client went away
any other ``JobError``             INTERNAL                the worker failed the job
anything else                      INTERNAL                a bug; logged with traceback
=================================  ======================  ===============================

Client values quoted in a message go through :func:`quote` (64 characters of it and its
size), and :func:`to_status` caps every message at
:data:`~hopserve.rpc.MAX_STATUS_BYTES` (:func:`bound_message`), so that no answer trips
gRPC's metadata size limit. Undecodable request bytes never get here: the service's
handlers answer them INVALID_ARGUMENT (:func:`hopserve.rpc.add_service`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable

import grpc
import numpy as np

from hopserve.logs import rate_limited
from hopserve.proto import contract
from hopserve.rpc import bound_message, quote

__all__ = [
    "DeadlineExceededError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "QueueFullError",
    "RequestCancelledError",
    "ServiceError",
    "ShuttingDownError",
    "bound_message",
    "format_bad_ids",
    "format_ids",
    "outcome_label",
    "quote",
    "to_status",
]

logger = rate_limited(__name__)

MAX_LISTED_IDS = 10
"""How many offending node IDs an error message names."""


class ServiceError(Exception):
    """An error with a client-facing message and the gRPC status it is answered with."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFoundError(ServiceError):
    """The requested model name (or version) is not served here."""

    code = grpc.StatusCode.NOT_FOUND


class InvalidRequestError(ServiceError):
    """The request itself is wrong (IDs, fanouts, options); retrying cannot help."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ModelNotReadyError(ServiceError):
    """The model is known but not loaded (yet); retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class ShuttingDownError(ServiceError):
    """The server is shutting down and accepts no new work."""

    code = grpc.StatusCode.UNAVAILABLE


class QueueFullError(ServiceError):
    """The model's batcher already holds ``server.max_queue`` waiting requests."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(ServiceError):
    """The request's deadline passed before its rows were computed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class RequestCancelledError(ServiceError):
    """The client cancelled the request (or went away)."""

    code = grpc.StatusCode.CANCELLED


def format_ids(ids: Iterable[int], total: int | None = None) -> str:
    """``"1, 2, 3"`` for at most :data:`MAX_LISTED_IDS` IDs, plus ``", ... (N more)"``."""
    listed = []
    count = 0
    for value in ids:
        if count < MAX_LISTED_IDS:
            listed.append(str(int(value)))
        count += 1
    total = count if total is None else total
    text = ", ".join(listed)
    if total > len(listed):
        text += f", ... ({total - len(listed)} more)"
    return text


def format_bad_ids(ids: np.ndarray, bad: np.ndarray) -> str:
    """The distinct IDs of ``ids`` where ``bad`` holds, in request order (first
    occurrence), as :func:`format_ids` lists them."""
    picked = ids[bad]
    _, first = np.unique(picked, return_index=True)
    return format_ids(picked[np.sort(first)])


def to_status(exc: BaseException, *, where: str = "") -> tuple[grpc.StatusCode, str]:
    """The status code and client-facing message (at most
    :data:`~hopserve.rpc.MAX_STATUS_BYTES` UTF-8 bytes) for ``exc``.

    Unexpected exceptions are logged here with their traceback under a short reference id
    that the client's message carries, so an operator can find the log line; their text
    never reaches the client.

    Args:
        exc: Anything raised while serving a request.
        where: Short description of the call for the log line (e.g. ``"GetEmbeddings sage"``).
    """
    code, message = _status(exc, where or "request")
    return code, bound_message(message)


def _status(exc: BaseException, where: str) -> tuple[grpc.StatusCode, str]:
    from hopserve.worker.graph.errors import UnknownNodeError

    if isinstance(exc, ServiceError):
        return exc.code, exc.message
    if isinstance(exc, UnknownNodeError):
        return grpc.StatusCode.INVALID_ARGUMENT, exc.message
    if isinstance(exc, contract.WorkerUnavailableError):
        logger.warning("%s: worker unavailable: %s", where, exc)
        return grpc.StatusCode.UNAVAILABLE, "no worker is available to compute the embeddings"
    if isinstance(exc, contract.DeadlineExceededError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded while computing"
    if isinstance(exc, contract.WorkerBusyError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, "all workers are busy; retry with backoff"
    if isinstance(exc, contract.ModelNotFoundError | contract.GraphVersionMismatchError):
        logger.warning("%s: worker cannot serve the job: %s", where, exc)
        return grpc.StatusCode.UNAVAILABLE, "the model is not available on its worker; retry"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED, "request cancelled"
    ref = uuid.uuid4().hex[:12]
    if isinstance(exc, contract.JobError):
        logger.error("%s: worker job failed [ref %s]: %s", where, ref, exc)
        return grpc.StatusCode.INTERNAL, f"embedding computation failed (ref {ref})"
    logger.error(
        "%s: unexpected error [ref %s]",
        where,
        ref,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return grpc.StatusCode.INTERNAL, f"internal error (ref {ref})"


def outcome_label(code: grpc.StatusCode | None) -> str:
    """The ``outcome`` metric label: ``"ok"`` or the lower-case status name."""
    if code is None or code is grpc.StatusCode.OK:
        return "ok"
    return code.name.lower()
