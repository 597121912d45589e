"""Shared core of :class:`EmbeddingClient` and :class:`AsyncEmbeddingClient`.

Everything that does not block lives here or in the modules it uses, once: argument
checks (:mod:`._checks`), request builders, answer checks and reassembly
(:class:`~._query.Query`), the retry policy, channel setup and health-answer mapping. The
sync and asyncio clients add only the I/O loops.

Retry policy: UNAVAILABLE, RESOURCE_EXHAUSTED and server-side CANCELLED (a server
shutting down) are retried up to ``max_retries`` times with exponential backoff and
full jitter (``uniform(0, min(backoff_max,
backoff_base * 2**attempt))``); a rate-limited answer's ``retry-after-ms`` hint is a
floor on that sleep. A call's deadline covers all of its RPCs and sleeps: when the next
sleep would reach the deadline the last error is raised at once.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy.typing as npt

from hopserve.client import _health
from hopserve.client._checks import (
    as_node_ids,
    check_cache_policy,
    check_fanouts,
    check_int,
    check_model,
    check_seconds,
    check_seed,
    check_timeout,
    check_version,
)
from hopserve.client._query import Deadline, Query
from hopserve.client.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    from_rpc_error,
    rpc_status,
)
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.proto.v1 import embedding_pb2_grpc
from hopserve.security.gate import RETRY_AFTER_KEY
from hopserve.security.tls import TlsError, channel_credentials

logger = logging.getLogger(__name__)

#: Channel options applied unless overridden by ``channel_options``. Responses carry
#: ``rows * dim * 4`` bytes (50,000 rows of 256 floats are 51 MB), far above gRPC's
#: 4 MiB default; reconnecting after 100 ms (not 1 s) lets the retry loop reach a
#: server that comes up moments after the first attempt.
DEFAULT_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.max_receive_message_length": -1,
    "grpc.initial_reconnect_backoff_ms": 100,
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


class EmbeddingClientBase:
    """Configuration, request builders and retry policy shared by both clients.

    Args:
        target: Server address, ``"host:port"`` (any gRPC target string).
        timeout: Default deadline of one client call in seconds, covering all of its RPCs
            and retries; None waits forever. Every method's ``timeout`` overrides it.
        max_retries: Retries after the first attempt on UNAVAILABLE, RESOURCE_EXHAUSTED
            and server-side CANCELLED.
        backoff_base: First backoff cap in seconds; doubles per retry (full jitter).
        backoff_max: Largest backoff cap in seconds.
        max_nodes_per_request: Most node IDs sent in one RPC; larger calls are split into
            consecutive RPCs and reassembled in request order.
        channel_options: Extra gRPC channel options, overriding
            :data:`DEFAULT_CHANNEL_OPTIONS` key by key.
        credentials: Ready-made gRPC channel credentials (instead of the TLS options).
        tls: Use TLS with the system's root certificates (implied by the options below).
        root_certificates: CA certificate(s) to trust, PEM (path or bytes): TLS.
        client_certificate: Client certificate chain for mutual TLS, PEM (path or bytes).
        client_key: Its private key, PEM (path or bytes).
        token: Bearer token sent with every call (``authorization`` metadata); never
            logged or shown in ``repr``.
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
        tls: bool = False,
        root_certificates: str | Path | bytes | None = None,
        client_certificate: str | Path | bytes | None = None,
        client_key: str | Path | bytes | None = None,
        token: str | None = None,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise InvalidArgumentError(
                f"target must be a non-empty 'host:port' string, got {target!r}"
            )
        if check_int("max_retries", max_retries) < 0:
            raise InvalidArgumentError(f"max_retries must be >= 0, got {max_retries}")
        if check_int("max_nodes_per_request", max_nodes_per_request) < 1:
            raise InvalidArgumentError(
                f"max_nodes_per_request must be >= 1, got {max_nodes_per_request}"
            )
        self._target = target
        self._timeout = check_timeout("timeout", timeout)
        self._max_retries = int(max_retries)
        self._backoff_base = check_seconds("backoff_base", backoff_base)
        self._backoff_max = check_seconds("backoff_max", backoff_max)
        self._max_nodes = int(max_nodes_per_request)
        options = dict(DEFAULT_CHANNEL_OPTIONS)
        options.update(dict(channel_options or ()))
        self._channel_options = list(options.items())
        self._credentials = _channel_credentials(
            credentials, tls, root_certificates, client_certificate, client_key
        )
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise InvalidArgumentError("token must be a non-empty string")
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token.strip()}"),) if token else ()
        )
        self._rng = random.Random()
        self._closed = False
        self._channel: Any = None
        self._init_channel()

    def _init_channel(self) -> None:
        """Hook run at the end of ``__init__`` (the blocking client opens its channel)."""

    def _open_channel(self, channels: Any) -> None:
        """Open the channel with ``channels`` (``grpc`` or ``grpc.aio``) and bind the stubs."""
        if self._credentials is None:
            self._channel = channels.insecure_channel(self._target, options=self._channel_options)
        else:
            self._channel = channels.secure_channel(
                self._target, self._credentials, self._channel_options
            )
        self._stub = embedding_pb2_grpc.EmbeddingServiceStub(self._channel)
        self._health_check = self._channel.unary_unary(
            _health.CHECK_METHOD,
            request_serializer=_health.HealthCheckRequest.SerializeToString,
            response_deserializer=_health.HealthCheckResponse.FromString,
        )

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
        add_nodes: Any = None,
        add_edges: Any = None,
        footprint: bool = False,
        edge_weights: Any = None,
        edge_features: Any = None,
        edge_relations: Any = None,
        node_type: str | None = None,
        add_node_type: str | None = None,
    ) -> Query:
        options = pb.QueryOptions(
            fanouts=check_fanouts(fanouts), cache_policy=check_cache_policy(cache_policy)
        )
        if seed is not None:
            options.seed = check_seed(seed)
        template = pb.GetEmbeddingsRequest(
            model=check_model(model), model_version=check_version(model_version), options=options
        )
        if node_type is not None:
            if not isinstance(node_type, str) or not node_type:
                raise InvalidArgumentError(
                    f"node_type must be a non-empty string (a node type name), got {node_type!r}"
                )
            template.node_type = node_type
        edge_data = (edge_weights, edge_features, edge_relations)
        if add_edges is None and any(v is not None for v in edge_data):
            raise InvalidArgumentError(
                "edge_weights / edge_features / edge_relations need add_edges"
            )
        if add_nodes is not None or add_edges is not None:  # request-scoped, never stored
            from hopserve.client.admin import edge_list, node_rows

            if add_nodes is not None:
                template.delta.add_nodes.CopyFrom(node_rows("add_nodes", add_nodes))
            if add_edges is not None:
                template.delta.add_edges.CopyFrom(edge_list("add_edges", add_edges, *edge_data))
        if add_node_type is not None:
            if add_nodes is None:
                raise InvalidArgumentError("add_node_type needs add_nodes")
            if not isinstance(add_node_type, str) or not add_node_type:
                raise InvalidArgumentError(
                    f"add_node_type must be a non-empty string, got {add_node_type!r}"
                )
            template.delta.add_nodes.node_type = add_node_type
        if not isinstance(footprint, bool):
            raise InvalidArgumentError(f"footprint must be a bool, got {footprint!r}")
        template.footprint = footprint
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
        delay = max(self._backoff(attempt), _retry_after(err))
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
    def _health_request(model: str | None) -> _health.HealthCheckRequest:
        """Health probe of the server ("" service) or of one model (its name)."""
        return _health.HealthCheckRequest(service="" if model is None else check_model(model))

    @staticmethod
    def _serving(resp: _health.HealthCheckResponse) -> bool:
        return resp.status == _health.SERVING

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


def _retry_after(err: grpc.RpcError) -> float:
    """The server's ``retry-after-ms`` hint in seconds (0.0 without one)."""
    try:
        trailing = err.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # an error without a call behind it
        return 0.0
    for key, value in trailing:
        if key == RETRY_AFTER_KEY:
            try:
                return max(0.0, min(float(value) / 1000.0, 60.0))
            except (TypeError, ValueError):
                return 0.0
    return 0.0


def _channel_credentials(
    credentials: grpc.ChannelCredentials | None,
    tls: bool,
    root_certificates: str | Path | bytes | None,
    client_certificate: str | Path | bytes | None,
    client_key: str | Path | bytes | None,
) -> grpc.ChannelCredentials | None:
    options = (root_certificates, client_certificate, client_key)
    if credentials is not None:
        if tls or any(o is not None for o in options):
            raise InvalidArgumentError(
                "give either credentials or the TLS options (tls, root_certificates, "
                "client_certificate, client_key), not both"
            )
        return credentials
    if not tls and all(o is None for o in options):
        return None
    try:
        return channel_credentials(root_certificates, client_certificate, client_key)
    except TlsError as err:
        raise InvalidArgumentError(str(err)) from None
