"""Redis-backed embedding cache: pipelined MGET / SET EX, and a circuit breaker.

One :meth:`~RedisEmbeddingCache.get_many` is one round trip (a pipeline of MGETs of at
most ``chunk_keys`` keys each); one :meth:`~RedisEmbeddingCache.put_many` is one round
trip (a pipeline of ``SET key value EX ttl``). redis-py uses the hiredis reply parser
automatically when ``hiredis`` is installed (``redis.utils.HIREDIS_AVAILABLE``).

Connections: at most ``max_connections`` round trips run at once. A call waits up to
``timeout_s`` for its turn and is otherwise skipped (a miss, or a dropped store) without
touching the breaker: a burst of requests is not an outage. (redis-py's own pool raises
``MaxConnectionsError`` at its cap instead of waiting; our bound keeps it from ever
reaching it.)

Failure handling: sockets time out after ``timeout_s``; redis-py's own retries are off.
The first failure opens the breaker: a WARNING is logged once for the outage, and every
call returns at once (all misses / store dropped) without touching Redis. Every
``backoff_s`` a background task PINGs Redis; when it answers, an INFO line is logged and
calls go to Redis again. So a dead or hung Redis costs a request at most one timeout, at
the moment it fails, and never fails the request. An error *reply* (e.g. ``OOM command not
allowed`` under ``noeviction``) is counted and logged at most once a minute, but does not
open the breaker: Redis is reachable, lookups still work.

Eviction: run Redis with ``maxmemory`` set and ``maxmemory-policy allkeys-lru`` (or
``volatile-lru`` if the Redis is shared and ``ttl_s > 0``); see ``server/cache/README.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from itertools import chain
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hopserve.config.types import SecretUrl, redact_url
from hopserve.logs import rate_limited
from hopserve.server.cache.base import CacheNamespace, CacheObserver, EmbeddingCache
from hopserve.server.cache.codec import (
    decode_rows,
    encode_rows,
    make_keys,
)

__all__ = ["RedisEmbeddingCache"]

logger = logging.getLogger(__name__)
# Skipped calls can repeat thousands of times a second: identical warnings fold, a minute.
skip_logger = rate_limited(f"{__name__}.skipped")

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)
"""Errors meaning Redis cannot be reached (open the breaker); anything else, e.g. an
``OOM command not allowed`` reply, is a per-command error that leaves the breaker closed."""


try:  # redis-py >= 7: maintenance notifications would relax our short timeouts to 10 s
    from redis.maint_notifications import MaintNotificationsConfig

    _CLIENT_EXTRAS: dict[str, Any] = {
        "maint_notifications_config": MaintNotificationsConfig(enabled=False)
    }
except ImportError:  # pragma: no cover - older redis-py has no such feature
    _CLIENT_EXTRAS = {}


def _reason(exc: BaseException) -> str:
    """One printable line: the error type and message, never the command's (binary) values."""
    text = str(exc)
    # redis-py quotes the whole failing pipeline command, values included; keep the cause.
    _, marker, cause = text.partition(" of pipeline caused error: ")
    text = cause if marker else text
    text = "".join(c if c.isprintable() else "?" for c in text).strip().strip("(),'\"")
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RedisEmbeddingCache(EmbeddingCache):
    """Embedding cache in Redis (``redis.asyncio``), safe to use when Redis is down.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL; its password is never logged.
        ttl_s: Expiry set on every stored row; 0 stores without expiry.
        prefix: First key component.
        timeout_s: Socket connect and read timeout.
        backoff_s: Time between availability probes while Redis is unavailable.
        chunk_keys: Most keys per MGET command (several go in one pipeline).
        max_connections: Round trips (and pooled connections) at once; more wait up to
            ``timeout_s`` for a turn.
        integrity_key: Secret keying the values' MAC (see :mod:`.codec`); ``None``: an
            unkeyed checksum (detects corruption, not forgery).
        observer: Optional receiver of cache events.
    """

    name = "redis"

    def __init__(
        self,
        url: str | SecretUrl,
        *,
        ttl_s: int = 3600,
        prefix: str = "hopserve",
        timeout_s: float = 0.25,
        backoff_s: float = 1.0,
        chunk_keys: int = 10_000,
        max_connections: int = 64,
        integrity_key: bytes | None = None,
        observer: CacheObserver | None = None,
    ) -> None:
        super().__init__(observer=observer)
        secret = url.get_secret_value() if isinstance(url, SecretUrl) else url
        if not prefix or any(c == ":" or c.isspace() for c in prefix):
            raise ValueError(f"prefix must be non-empty without ':' or whitespace (got {prefix!r})")
        if ttl_s < 0 or timeout_s <= 0 or backoff_s < 0 or chunk_keys < 1 or max_connections < 1:
            raise ValueError(
                "need ttl_s >= 0, timeout_s > 0, backoff_s >= 0, chunk_keys >= 1, "
                f"max_connections >= 1 (got {ttl_s}, {timeout_s}, {backoff_s}, {chunk_keys}, "
                f"{max_connections})"
            )
        self.url = redact_url(secret)
        """The URL with its password redacted (safe to log)."""
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.chunk_keys = chunk_keys
        self._integrity_key = integrity_key or None
        self._turns = asyncio.Semaphore(max_connections)
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            secret,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the breaker decides when to try again
            max_connections=max_connections,
            health_check_interval=0,
            **_CLIENT_EXTRAS,
        )
        self._up = True
        self._down_since = 0.0
        self._retry_at = 0.0
        self._probe_task: asyncio.Task[None] | None = None
        self._closed = False
        self._reported_up: bool | None = None  # last state sent to the observer

    def __repr__(self) -> str:
        state = "up" if self._up else "down"
        return f"RedisEmbeddingCache(url={self.url!r}, ttl_s={self.ttl_s}, {state})"

    @property
    def available(self) -> bool:
        """False while the breaker is open (Redis failed and has not answered since)."""
        return self._up

    async def _get(
        self, namespace: CacheNamespace, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One pipelined round trip of MGETs."""
        n = ids.size
        mask = np.zeros(n, dtype=bool)
        rows = np.zeros((n, namespace.dim), dtype=np.float32)
        if not self._usable():
            return mask, rows
        keys = make_keys(self.prefix, namespace, ids)
        if not await self._take_turn(namespace, "get"):
            return mask, rows
        start = time.perf_counter()
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for first in range(0, n, self.chunk_keys):
                    pipe.mget(keys[first : first + self.chunk_keys])
                replies = await pipe.execute()
        except Exception as exc:  # a cache failure must never fail a request
            self._failed(exc, namespace, "get")
            return mask, rows
        finally:
            self._turns.release()
        self._reachable("get", time.perf_counter() - start)
        values = list(chain.from_iterable(replies))
        mask, rows, rejected = decode_rows(values, keys, namespace.dim, self._integrity_key)
        if rejected:
            logger.debug(
                "cached value(s) in %s:%s:... refused (%s); treated as misses",
                self.prefix,
                namespace.model,
                dict(rejected),
            )
            self._record_rejected(namespace, rejected)
        return mask, rows

    async def _put(self, namespace: CacheNamespace, ids: np.ndarray, array: np.ndarray) -> None:
        """One pipelined round trip of SET EX."""
        if not self._usable():
            return
        keys, packed = encode_rows(
            array, make_keys(self.prefix, namespace, ids), self._integrity_key
        )
        if not keys:
            return
        expiry: tuple[Any, ...] = ("EX", self.ttl_s) if self.ttl_s else ()
        if not await self._take_turn(namespace, "put"):
            return
        start = time.perf_counter()
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, value in zip(keys, packed, strict=True):
                    pipe.execute_command("SET", key, value, *expiry)
                await pipe.execute()
        except Exception as exc:  # a cache failure must never fail a request
            self._failed(exc, namespace, "put")
            return
        finally:
            self._turns.release()
        self._reachable("put", time.perf_counter() - start)

    async def check(self) -> str | None:
        """PING Redis once, leaving the breaker alone.

        Returns:
            ``None`` if Redis answered, else a one-line reason (no password in it).
        """
        start = time.perf_counter()
        try:
            await asyncio.wait_for(self._client.ping(), timeout=self.timeout_s * 2)
        except Exception as exc:  # any failure means 'not reachable'
            return _reason(exc) if not isinstance(exc, TimeoutError) else "timed out"
        self._reachable("ping", time.perf_counter() - start)
        return None

    def mark_unavailable(self, reason: str) -> None:
        """Open the breaker (logs the outage WARNING if it was closed); probes follow."""
        self._open(reason)

    async def close(self) -> None:
        """Stop probing and close the connection pool."""
        self._closed = True
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        await self._client.aclose()

    async def _take_turn(self, namespace: CacheNamespace, op: str) -> bool:
        """Wait up to ``timeout_s`` for one of ``max_connections`` turns; False: skip the
        call (counted as an error, logged at most once a minute; the breaker stays)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._turns.acquire()
        except TimeoutError:
            self._record_error(namespace, op)
            skip_logger.warning(
                "Redis cache at %s: every connection busy for %.2gs; a %s was skipped "
                "(raise cache.redis_max_connections)",
                self.url,
                self.timeout_s,
                op,
            )
            return False
        return True

    # Circuit breaker --------------------------------------------------------------------

    def _usable(self) -> bool:
        """True if calls should go to Redis now; else maybe start a background probe."""
        if self._up:
            return True
        if (
            not self._closed
            and time.monotonic() >= self._retry_at
            and (self._probe_task is None or self._probe_task.done())
        ):
            self._probe_task = asyncio.get_running_loop().create_task(self._probe())
        return False

    def _failed(self, exc: BaseException, namespace: CacheNamespace, op: str) -> None:
        self._record_error(namespace, op)
        if isinstance(exc, _UNREACHABLE):
            self._open(_reason(exc))
            return
        # Redis answered with an error (full under noeviction, read-only replica, ...):
        # keep using it, and say so (the rate-limited logger folds repeats).
        skip_logger.warning(
            "Redis cache at %s rejected a %s (%s); the call was skipped (rows missed or "
            "not stored)",
            self.url,
            op,
            _reason(exc),
        )

    def _open(self, reason: str) -> None:
        now = time.monotonic()
        self._retry_at = now + self.backoff_s
        if self._up:
            self._up = False
            self._down_since = now
            logger.warning(
                "Redis cache at %s is unavailable (%s); serving without it and retrying "
                "every %.2gs",
                self.url,
                reason,
                self.backoff_s,
            )
        self._report_available(False)

    async def _probe(self) -> None:
        reason = await self.check()
        if reason is not None:
            self._retry_at = time.monotonic() + self.backoff_s
            logger.debug("Redis cache at %s still unavailable (%s)", self.url, reason)
            return
        if not self._up:
            self._up = True
            logger.info(
                "Redis cache at %s is reachable again after %.1fs",
                self.url,
                time.monotonic() - self._down_since,
            )
            self._report_available(True)

    def _reachable(self, op: str, seconds: float) -> None:
        """A round trip succeeded: record its latency; report the backend up."""
        self._record_operation(op, seconds)
        self._report_available(True)

    def _report_available(self, up: bool) -> None:
        if self._reported_up is not up:
            self._reported_up = up
            self._record_available(up)
