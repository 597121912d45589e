"""Shared core of :class:`EmbeddingClient` and :class:`AsyncEmbeddingClient`.

Everything that does not block lives here, once: argument validation, request builders,
response checks and reassembly (:class:`Query`), the retry policy and health-answer
mapping. The sync and asyncio clients add only the I/O loops.

Retry policy: UNAVAILABLE, RESOURCE_EXHAUSTED and server-side CANCELLED (a server
shutting down) are retried up to ``max_retries``
times with exponential backoff and full jitter (``uniform(0, min(backoff_max,
backoff_base * 2**attempt))``). A call's deadline covers all of its RPCs and sleeps:
when the next sleep would reach the deadline the last error is raised at once.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import grpc
import numpy as np
import numpy.typing as npt

from hopserve.client.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    MalformedResponseError,
    from_rpc_error,
    rpc_status,
)
from hopserve.client.results import TIMING_STAGES, EmbeddingResult
from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb

logger = logging.getLogger(__name__)

#: Channel options applied unless overridden by ``channel_options``. Responses carry
#: ``rows * dim * 4`` bytes (50,000 rows of 256 floats are 51 MB), far above gRPC's
#: 4 MiB default; reconnecting after 100 ms (not 1 s) lets the retry loop reach a
#: server that comes up moments after the first attempt.
DEFAULT_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.max_receive_message_length": -1,
    "grpc.initial_reconnect_backoff_ms": 100,
}

#: ``cache_policy`` argument -> ``hopserve.v1.CachePolicy``.
CACHE_POLICIES: dict[str, int] = {
    "use": pb.CACHE_USE,
    "refresh": pb.CACHE_REFRESH,
    "bypass": pb.CACHE_BYPASS,
}

#: Status codes worth retrying: the server was unreachable, shed load, or cancelled the
#: call itself. The clients never cancel a call they still wait for (a deadline is
#: DEADLINE_EXCEEDED; cancelling an asyncio call raises CancelledError, not an RpcError),
#: so a CANCELLED status came from the server side: a server shutting down cancels the
#: calls it had received but not started. Every hopserve RPC is an idempotent read.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)

#: Health-check failures that mean "not ready" rather than a broken call.
_HEALTH_NOT_READY = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,  # unknown service: the model is not loaded
        grpc.StatusCode.UNAVAILABLE,  # server down or still starting
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)

_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1
_INT64 = np.iinfo(np.int64)


class Deadline:
    """Absolute monotonic deadline shared by every RPC and sleep of one client call."""

    __slots__ = ("at", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        """Seconds left (may be <= 0), or None without a deadline."""
        return None if self.at is None else self.at - time.monotonic()

    def rpc_timeout(self) -> float | None:
        """Timeout for the next RPC; raises :class:`DeadlineExceededError` if none is left."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise DeadlineExceededError(f"deadline of {self.timeout:g}s exceeded")
        return left


# --------------------------------------------------------------------------- validation


def as_node_ids(node_ids: npt.ArrayLike) -> np.ndarray:
    """Validate ``node_ids`` and return them as a 1-D int64 array.

    Raises:
        InvalidArgumentError: Not 1-D, empty, not integers, or outside int64.
    """
    try:
        arr = np.asarray(node_ids)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"node_ids is not array-like: {exc}") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"node_ids must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidArgumentError("node_ids is empty")
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"node_ids must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and int(arr.max()) > _INT64.max:
        raise InvalidArgumentError(f"node id {int(arr.max())} does not fit in int64")
    return arr.astype(np.int64, copy=False)


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    return int(value)


def check_fanouts(fanouts: Sequence[int] | None) -> list[int]:
    """Validate per-layer fanouts (``-1`` = all neighbours, else ``>= 1``); None -> []."""
    if fanouts is None:
        return []
    if isinstance(fanouts, str | bytes) or not isinstance(fanouts, Sequence | np.ndarray):
        raise InvalidArgumentError(f"fanouts must be a sequence of ints, got {fanouts!r}")
    out = [_check_int("fanouts entry", f) for f in fanouts]
    for layer, f in enumerate(out, start=1):
        if f != -1 and not 1 <= f <= _INT32_MAX:
            raise InvalidArgumentError(
                f"fanouts[{layer - 1}] (layer {layer}) must be -1 (all) or >= 1, got {f}"
            )
    return out


def check_cache_policy(cache_policy: str) -> int:
    """Map ``"use" | "refresh" | "bypass"`` (any case) to ``hopserve.v1.CachePolicy``."""
    key = cache_policy.lower() if isinstance(cache_policy, str) else None
    if key not in CACHE_POLICIES:
        raise InvalidArgumentError(
            f"cache_policy must be one of {sorted(CACHE_POLICIES)}, got {cache_policy!r}"
        )
    return CACHE_POLICIES[key]


def check_model(model: str) -> str:
    """Validate a model name (non-empty string)."""
    if not isinstance(model, str) or not model:
        raise InvalidArgumentError(f"model must be a non-empty string, got {model!r}")
    return model


def check_version(version: str | int | None) -> str:
    """Model version as the wire string; None -> "" (latest)."""
    if version is None:
        return ""
    if isinstance(version, bool) or not isinstance(version, str | int):
        raise InvalidArgumentError(f"model_version must be a str, int or None, got {version!r}")
    return str(version)


def check_timeout(name: str, timeout: float | None) -> float | None:
    """Validate a timeout in seconds: None (no deadline) or a finite number > 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds or None, got {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise InvalidArgumentError(f"{name} must be > 0 and finite, got {timeout!r}")
    return float(timeout)


def _check_seconds(name: str, value: float) -> float:
    """A required duration: a finite number of seconds > 0."""
    if value is None:
        raise InvalidArgumentError(f"{name} must be a number of seconds, got None")
    return check_timeout(name, value)  # type: ignore[return-value]


# --------------------------------------------------------------------------- one call


class Query:
    """One validated embedding call: its rows, request template, deadline and results.

    The call is served by successive RPCs, each covering ``ids[done : done + block]`` (a unary GetEmbeddings, or a StreamEmbeddings that may break and be
    resumed from ``done``). The first answer pins the model version for the rest, and
    every answer is checked against the contract before its rows are accepted.
    """

    def __init__(
        self, ids: np.ndarray, template: pb.GetEmbeddingsRequest, deadline: Deadline, block: int
    ) -> None:
        self.ids = ids
        self.template = template
        self.deadline = deadline
        self.block = block
        self.done = 0  # rows accepted so far (a prefix of ids)
        self._start = 0  # first row of the RPC in flight
        self._stop = 0  # one past its last row
        self._meta: tuple[str, str, str, int] | None = None  # model, version, graph, dim
        self._out: np.ndarray | None = None
        self._timing = dict.fromkeys(TIMING_STAGES, 0.0)
        self._layers: list[float] = []
        self._cache_hits = 0

    @property
    def n(self) -> int:
        """Number of requested rows."""
        return len(self.ids)

    @property
    def finished(self) -> bool:
        """Whether every row has been accepted."""
        return self.done >= self.n

    def describe(self) -> str:
        """Short call description for error messages."""
        return f"model={self.template.model!r}, rows {self._start}..{self._stop} of {self.n}"

    def next_request(self) -> pb.GetEmbeddingsRequest:
        """Request for the next ``block`` rows not yet accepted."""
        self._start, self._stop = self.done, min(self.done + self.block, self.n)
        request = pb.GetEmbeddingsRequest()
        request.CopyFrom(self.template)
        request.node_ids.extend(self.ids[self._start : self._stop].tolist())
        return request

    # -- unary ------------------------------------------------------------------------

    def add_response(self, resp: pb.GetEmbeddingsResponse) -> None:
        """Accept a GetEmbeddings answer for the rows of the last :meth:`next_request`."""
        rows = self._stop - self._start
        if resp.num_nodes != rows:
            self._malformed(f"response has num_nodes={resp.num_nodes}, expected {rows}")
        self._check_meta(resp.model, resp.model_version, resp.graph_version, resp.dim)
        block = self._decode(resp.embeddings, resp.dtype, rows, resp.dim)
        if self._out is None:
            self._out = np.empty((self.n, resp.dim), dtype=np.float32)
        self._out[self._start : self._stop] = block
        self._add_stats(resp.timing if resp.HasField("timing") else None, resp.cache_hits)
        self.done = self._stop

    def result(self) -> EmbeddingResult:
        """The assembled result once :attr:`finished` (unary path)."""
        assert self._out is not None and self._meta is not None and self.finished
        model, version, graph, _ = self._meta
        return EmbeddingResult(
            embeddings=self._out,
            model=model,
            model_version=version,
            graph_version=graph,
            timing=dict(self._timing),
            layer_compute=tuple(self._layers),
            cache_hits=self._cache_hits,
        )

    # -- streaming --------------------------------------------------------------------

    def add_chunk(self, chunk: pb.EmbeddingChunk) -> tuple[int, np.ndarray]:
        """Accept one stream chunk; returns ``(row offset into node_ids, rows)``."""
        rows = self._stop - self._start
        if chunk.num_nodes != rows:
            self._malformed(f"chunk has num_nodes={chunk.num_nodes}, expected {rows}")
        expected = self.done - self._start
        if chunk.offset != expected:
            self._malformed(f"chunk at offset {chunk.offset}, expected {expected} (in order)")
        if not 1 <= chunk.num_rows <= rows - expected:
            self._malformed(f"chunk has num_rows={chunk.num_rows}, {rows - expected} rows left")
        self._check_meta(chunk.model, chunk.model_version, chunk.graph_version, chunk.dim)
        block = self._decode(chunk.embeddings, chunk.dtype, chunk.num_rows, chunk.dim)
        self._add_stats(chunk.timing if chunk.HasField("timing") else None, chunk.cache_hits)
        offset = self.done
        self.done += chunk.num_rows
        return offset, block.astype(np.float32)  # a writable, native-order copy

    def end_stream(self) -> None:
        """Check that a stream that ended normally delivered all of its rows."""
        if self.done != self._stop:
            self._malformed(
                f"stream ended after {self.done - self._start} of {self._stop - self._start} rows"
            )

    # -- checks -----------------------------------------------------------------------

    def _malformed(self, what: str) -> NoReturn:
        raise MalformedResponseError(f"{self.describe()}: {what}")

    def _check_meta(self, model: str, version: str, graph: str, dim: int) -> None:
        meta = (model, version, graph, dim)
        if self._meta is None:
            self._meta = meta
            self.template.model_version = version  # pin the version for later RPCs
        elif meta != self._meta:
            raise MalformedResponseError(
                f"{self.describe()}: answer (model, model_version, graph_version, dim)="
                f"{meta} differs from the call's first answer {self._meta}; rows computed "
                "on different graph or model versions cannot be combined, retry the call",
                grpc.StatusCode.ABORTED,
            )

    def _decode(self, data: bytes, dtype: int, rows: int, dim: int) -> np.ndarray:
        if dtype != pb.DTYPE_FLOAT32:
            name = pb.DType.Name(dtype) if dtype in pb.DType.values() else str(dtype)
            self._malformed(f"unsupported dtype {name}")
        try:
            return decode_embeddings(data, rows, dim)
        except ValueError as exc:
            raise MalformedResponseError(f"{self.describe()}: {exc}") from None

    def _add_stats(self, timing: pb.StageTiming | None, cache_hits: int) -> None:
        self._cache_hits += cache_hits
        if timing is None:
            return
        for stage in TIMING_STAGES:
            self._timing[stage] += getattr(timing, stage)
        layers = list(timing.layer_compute)
        if len(layers) > len(self._layers):
            self._layers.extend([0.0] * (len(layers) - len(self._layers)))
        for i, t in enumerate(layers):
            self._layers[i] += t


# --------------------------------------------------------------------------- client base


class EmbeddingClientBase:
    """Configuration, request builders and retry policy shared by both clients.

    Args:
        target: Server address, ``"host:port"`` (any gRPC target string).
        timeout: Default deadline of one client call in seconds, covering all of its RPCs
            and retries; None waits forever. Every method's ``timeout`` overrides it.
        max_retries: Retries after the first attempt on UNAVAILABLE / RESOURCE_EXHAUSTED.
        backoff_base: First backoff cap in seconds; doubles per retry.
        backoff_max: Largest backoff cap in seconds.
        max_nodes_per_request: Most node IDs sent in one RPC; larger calls are split into
            consecutive RPCs and reassembled in request order.
        channel_options: Extra gRPC channel options, overriding
            :data:`DEFAULT_CHANNEL_OPTIONS` key by key.
        credentials: TLS credentials; None uses an insecure (plaintext) channel.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 10.0,
        max_retries: int = 4,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        max_nodes_per_request: int = 50_000,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise InvalidArgumentError(
                f"target must be a non-empty 'host:port' string, got {target!r}"
            )
        if _check_int("max_retries", max_retries) < 0:
            raise InvalidArgumentError(f"max_retries must be >= 0, got {max_retries}")
        if _check_int("max_nodes_per_request", max_nodes_per_request) < 1:
            raise InvalidArgumentError(
                f"max_nodes_per_request must be >= 1, got {max_nodes_per_request}"
            )
        self._target = target
        self._timeout = check_timeout("timeout", timeout)
        self._max_retries = int(max_retries)
        self._backoff_base = _check_seconds("backoff_base", backoff_base)
        self._backoff_max = _check_seconds("backoff_max", backoff_max)
        self._max_nodes = int(max_nodes_per_request)
        options = dict(DEFAULT_CHANNEL_OPTIONS)
        options.update(dict(channel_options or ()))
        self._channel_options = list(options.items())
        self._credentials = credentials
        self._rng = random.Random()
        self._closed = False

    @property
    def target(self) -> str:
        """The server address this client talks to."""
        return self._target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._target!r}, timeout={self._timeout})"

    # -- request builders -------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> Deadline:
        """Start a client call: check the client is usable, then fix its deadline."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} for {self._target} is closed")
        self._ensure_channel()
        if timeout is None:
            return Deadline(self._timeout)
        return Deadline(check_timeout("timeout", timeout))

    def _ensure_channel(self) -> None:
        """Hook run at the start of every call (the asyncio client opens its channel)."""

    def _query(
        self,
        model: str,
        node_ids: npt.ArrayLike,
        fanouts: Sequence[int] | None,
        cache_policy: str,
        model_version: str | int | None,
        seed: int | None,
        timeout: float | None,
    ) -> Query:
        options = pb.QueryOptions(
            fanouts=check_fanouts(fanouts), cache_policy=check_cache_policy(cache_policy)
        )
        if seed is not None:
            seed = _check_int("seed", seed)
            if not 0 <= seed <= _UINT64_MAX:
                raise InvalidArgumentError(f"seed must be in [0, 2**64), got {seed}")
            options.seed = seed
        template = pb.GetEmbeddingsRequest(
            model=check_model(model), model_version=check_version(model_version), options=options
        )
        ids = as_node_ids(node_ids)
        return Query(ids, template, self._deadline(timeout), self._max_nodes)

    @staticmethod
    def _model_request(name: str, version: str | int | None) -> pb.GetModelRequest:
        return pb.GetModelRequest(name=check_model(name), version=check_version(version))

    # -- retry policy -----------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        """Full-jitter backoff before retry number ``attempt + 1``."""
        cap = min(self._backoff_max, self._backoff_base * 2.0 ** min(attempt, 62))
        return self._rng.uniform(0.0, cap)

    def _retry_delay(self, err: grpc.RpcError, attempt: int, deadline: Deadline) -> float | None:
        """Seconds to sleep before retrying after ``err``, or None to give up now."""
        code, details = rpc_status(err)
        if code not in RETRYABLE_CODES or attempt >= self._max_retries:
            return None
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            return None  # a message-size limit: deterministic, retrying cannot help
        delay = self._backoff(attempt)
        left = deadline.remaining()
        if left is not None and delay >= left:
            return None
        logger.debug(
            "%s from %s, retry %d/%d in %.3fs: %s",
            code.name,
            self._target,
            attempt + 1,
            self._max_retries,
            delay,
            details,
        )
        return delay

    # -- health -----------------------------------------------------------------------

    @staticmethod
    def _health_service(model: str | None) -> str:
        """Health service name: "" for the server, the model name for one model."""
        return "" if model is None else check_model(model)

    @staticmethod
    def _health_failure(err: grpc.RpcError) -> bool:
        """False for failures that mean "not ready"; raise the mapped error otherwise."""
        code, _ = rpc_status(err)
        if code in _HEALTH_NOT_READY:
            return False
        raise from_rpc_error(err, "Health/Check") from None

    def _probe_timeout(self, deadline: Deadline, model: str | None) -> float | None:
        """Timeout of one health probe inside ``wait_until_ready``."""
        left = deadline.remaining()
        if left is None:
            return self._timeout
        if left <= 0:
            raise self._not_ready(deadline, model)
        return left

    def _poll_delay(self, attempt: int, deadline: Deadline, model: str | None) -> float:
        """Sleep before health probe ``attempt + 2``; raises once the deadline is near."""
        delay = self._backoff(attempt)
        left = deadline.remaining()
        if left is not None and delay >= left:
            raise self._not_ready(deadline, model)
        return delay

    def _not_ready(self, deadline: Deadline, model: str | None) -> DeadlineExceededError:
        what = "server" if model is None else f"model {model!r}"
        return DeadlineExceededError(
            f"{what} at {self._target} not ready within {deadline.timeout:g}s"
        )
