"""What the Redis and Redis Cluster caches share: envelopes, turns and the circuit breaker.

:class:`RedisBackedCache` turns node ids into keys, rows into integrity envelopes
(:mod:`.codec`) and back, and keeps Redis off the request path while it is sick. A
backend (:class:`~.redis_cache.RedisEmbeddingCache`,
:class:`~.redis_cluster.RedisClusterEmbeddingCache`) supplies only the round trips:
:meth:`~RedisBackedCache._fetch`, :meth:`~RedisBackedCache._store`,
:meth:`~RedisBackedCache._ping` and :meth:`~RedisBackedCache._close_client`, and may
override the key scheme (:meth:`~RedisBackedCache._keys`).

Connections: at most ``max_connections`` round trips run at once. A call waits up to
``timeout_s`` for its turn and is otherwise skipped (a miss, or a dropped store) without
touching the breaker: a burst of requests is not an outage. (redis-py's pools raise
``MaxConnectionsError`` at their cap instead of waiting; our bound keeps them from ever
reaching it.)

Small lookups (fewer than ``chunk_keys`` keys) are grouped: a lookup that finds no round
of lookups in flight starts one; lookups made while it is in flight wait for it and then go
together in the next, one pipeline for all of them (at most ``4 * chunk_keys`` keys a
round). A lookup that waited ``timeout_s`` for its round is skipped (a miss, counted as a
call without a turn is), so a slow Redis still costs a request at most about one timeout;
larger lookups are round trips of their own. The values are decoded by each caller. Under concurrent requests this is one round trip, and one pass of redis-py's
Python command packing and parsing, per group instead of per request (a 4-key lookup
costs about 0.24 ms of the event loop's CPU, 32 of them grouped about 0.02 ms each); a
lone lookup goes at once.

Failure handling: sockets time out after ``timeout_s``; redis-py's own retries are off.
The first failure that means "unreachable" (:attr:`RedisBackedCache.unreachable`) opens
the breaker: a WARNING is logged once for the outage, and every call returns at once (all
misses / store dropped) without touching Redis. Every ``backoff_s`` a background task
probes Redis (:meth:`RedisBackedCache.check`); when it answers, an INFO line is logged and
calls go to Redis again. So a dead or hung Redis costs a request at most one timeout, at
the moment it fails, and never fails the request. An error *reply* (e.g. ``OOM command
not allowed`` under ``noeviction``) is counted and logged at most once a minute, but does
not open the breaker: Redis is reachable, lookups still work.

Log lines come from the backend's own module logger (``hopserve.server.cache.redis_cache``
or ``...redis_cluster``), so each backend's outages can be filtered apart.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hopserve.logs import rate_limited
from hopserve.server.cache.base import CacheNamespace, CacheObserver, EmbeddingCache
from hopserve.server.cache.codec import decode_rows_seq, encode_rows, make_keys

__all__ = ["CLIENT_EXTRAS", "RedisBackedCache", "reason_of"]

try:  # redis-py >= 7: maintenance notifications would relax our short timeouts to 10 s
    from redis.maint_notifications import MaintNotificationsConfig

    CLIENT_EXTRAS: dict[str, Any] = {
        "maint_notifications_config": MaintNotificationsConfig(enabled=False)
    }
    """Keyword arguments every redis-py client of ours gets."""
except ImportError:  # pragma: no cover - older redis-py has no such feature
    CLIENT_EXTRAS = {}


def reason_of(exc: BaseException) -> str:
    """One printable line: the error type and message, never the command's (binary) values."""
    text = str(exc)
    # redis-py quotes the whole failing pipeline command, values included; keep the cause.
    _, marker, cause = text.partition(" of pipeline caused error: ")
    text = cause if marker else text
    text = "".join(c if c.isprintable() else "?" for c in text).strip().strip("(),'\"")
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(eq=False)
class _Lookup:
    """One caller's lookup waiting for its round: ``answer`` gets the stored values of
    ``keys`` (decoded by the caller), or ``None`` for all misses."""

    namespace: CacheNamespace
    keys: list[str]
    answer: asyncio.Future[Sequence[bytes | None] | None]
    since: float  # loop time it joined the queue

    def miss(self) -> None:
        """Answer all misses (the backend is down, skipped or closing)."""
        if not self.answer.done():
            self.answer.set_result(None)


def _misses(n: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(n, dtype=bool), np.zeros((n, dim), dtype=np.float32), np.zeros(n, np.int64)


class RedisBackedCache(EmbeddingCache):
    """Envelopes, turns and the circuit breaker around a Redis-protocol backend.

    Args:
        where: Where the backend is, for logs and reprs (no password in it).
        ttl_s: Expiry set on every stored row; 0 stores without expiry.
        prefix: First key component.
        timeout_s: Socket connect and read timeout (the backend's client uses it).
        backoff_s: Time between availability probes while the backend is unavailable.
        chunk_keys: Most keys per MGET command (several go in one pipeline).
        max_connections: Round trips at once; more wait up to ``timeout_s`` for a turn.
        integrity_key: Secret keying the values' MAC (see :mod:`.codec`); ``None``: an
            unkeyed checksum (detects corruption, not forgery).
        observer: Optional receiver of cache events.
    """

    label: ClassVar[str] = "Redis"
    """What log lines call the backend (``"Redis"``, ``"Redis Cluster"``)."""

    unreachable: ClassVar[tuple[type[BaseException], ...]] = (
        RedisConnectionError,
        RedisTimeoutError,
        OSError,
        TimeoutError,
    )
    """Errors meaning the backend cannot be reached (they open the breaker); anything
    else, e.g. an ``OOM command not allowed`` reply, is a per-command error that leaves
    the breaker closed."""

    def __init__(
        self,
        where: str,
        *,
        ttl_s: int,
        prefix: str,
        timeout_s: float,
        backoff_s: float,
        chunk_keys: int,
        max_connections: int,
        integrity_key: bytes | None,
        observer: CacheObserver | None,
    ) -> None:
        super().__init__(observer=observer)
        if not prefix or any(c == ":" or c.isspace() or c in "{}" for c in prefix):
            raise ValueError(
                f"prefix must be non-empty without ':', '{{', '}}' or whitespace (got {prefix!r})"
            )
        if ttl_s < 0 or timeout_s <= 0 or backoff_s < 0 or chunk_keys < 1 or max_connections < 1:
            raise ValueError(
                "need ttl_s >= 0, timeout_s > 0, backoff_s >= 0, chunk_keys >= 1, "
                f"max_connections >= 1 (got {ttl_s}, {timeout_s}, {backoff_s}, {chunk_keys}, "
                f"{max_connections})"
            )
        self.where = where
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.chunk_keys = chunk_keys
        self._integrity_key = integrity_key or None
        self._turns = asyncio.Semaphore(max_connections)
        self._logger = logging.getLogger(type(self).__module__)
        # Skipped calls can repeat thousands of times a second: identical warnings fold.
        self._skip_logger = rate_limited(f"{type(self).__module__}.skipped")
        self._up = True
        self._down_since = 0.0
        self._retry_at = 0.0
        self._probe_task: asyncio.Task[None] | None = None
        self._closed = False
        self._reported_up: bool | None = None  # last state sent to the observer
        self._lookups: list[_Lookup] = []  # waiting for the next round
        self._reader: asyncio.Task[None] | None = None  # the round trips of lookups

    def __repr__(self) -> str:
        state = "up" if self._up else "down"
        return f"{type(self).__name__}({self.where!r}, ttl_s={self.ttl_s}, {state})"

    @property
    def available(self) -> bool:
        """False while the breaker is open (the backend failed and has not answered since)."""
        return self._up

    # The backend's part ------------------------------------------------------------------

    def _keys(self, namespace: CacheNamespace, ids: np.ndarray) -> list[str]:
        """The key of each id, in order (:func:`.codec.make_keys` unless overridden)."""
        return make_keys(self.prefix, namespace, ids)

    @abc.abstractmethod
    async def _fetch(self, keys: list[str]) -> Sequence[bytes | None]:
        """The stored values of ``keys``, in order (``None``: absent), in one round trip;
        raises on failure."""

    @abc.abstractmethod
    async def _store(self, keys: list[str], values: list[bytes], expiry: tuple[Any, ...]) -> None:
        """``SET key value *expiry`` for each pair, in one round trip; raises on failure."""

    @abc.abstractmethod
    async def _ping(self) -> None:
        """Check that the backend serves requests; raises if it does not."""

    @abc.abstractmethod
    async def _close_client(self) -> None:
        """Close the client's connections."""

    # EmbeddingCache ----------------------------------------------------------------------

    async def _get(
        self, namespace: CacheNamespace, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._closed or not self._usable():
            return _misses(ids.size, namespace.dim)
        keys = self._keys(namespace, ids)
        if len(keys) >= self.chunk_keys:  # a large lookup is a round trip of its own
            values = await self._round_trip(namespace, keys)
        else:
            values = await self._grouped(namespace, keys)
        if values is None:
            return _misses(ids.size, namespace.dim)
        mask, rows, seqs, rejected = decode_rows_seq(
            values, keys, namespace.dim, self._integrity_key
        )
        if rejected:
            self._logger.debug(
                "cached value(s) in %s:%s:... refused (%s); treated as misses",
                self.prefix,
                namespace.model,
                dict(rejected),
            )
            self._record_rejected(namespace, rejected)
        return mask, rows, seqs

    async def _round_trip(
        self, namespace: CacheNamespace, keys: list[str]
    ) -> Sequence[bytes | None] | None:
        """One turn and one fetch of ``keys``; ``None`` when no turn came within
        ``timeout_s``, the breaker opened meanwhile, or the fetch failed (counted)."""
        if not await self._take_turn(namespace, "get"):
            return None
        start = time.perf_counter()
        try:
            if not self._up:  # opened while this call waited for its turn
                return None
            values = await self._fetch(keys)
        except Exception as exc:  # a cache failure must never fail a request
            self._failed(exc, namespace, "get")
            return None
        finally:
            self._turns.release()
        self._reachable("get", time.perf_counter() - start)
        return values

    async def _grouped(
        self, namespace: CacheNamespace, keys: list[str]
    ) -> Sequence[bytes | None] | None:
        """``keys`` fetched in the next round of small lookups (see the module docstring)."""
        loop = asyncio.get_running_loop()
        reader = self._reader
        if reader is not None and reader.get_loop() is not loop:  # its loop is gone
            self._reader = reader = None
            self._lookups = [x for x in self._lookups if x.answer.get_loop() is loop]
        lookup = _Lookup(namespace, keys, loop.create_future(), loop.time())
        self._lookups.append(lookup)
        if reader is None or reader.done():
            self._reader = loop.create_task(self._read_lookups())
        # Cancelling the caller cancels only its answer; the round goes on for the others.
        return await lookup.answer

    async def _read_lookups(self) -> None:
        """Round trips of the waiting lookups, a group at a time, until none wait."""
        while self._lookups:
            group = self._next_group()
            try:
                await self._read_group(group)
            except Exception:  # a bug: this group misses, the next ones still go
                self._logger.exception("%s cache: a round of lookups failed", self.label)
            finally:  # answered, cancelled (close) or failed: no caller waits forever
                for lookup in group:
                    lookup.miss()

    def _next_group(self) -> list[_Lookup]:
        """The waiting lookups, oldest first, up to ``4 * chunk_keys`` keys; those whose
        callers gave up are dropped, and those that waited ``timeout_s`` already are
        answered with misses (skipped and counted, as a call without a turn is)."""
        taken, keys = 0, 0
        for lookup in self._lookups:
            if taken and keys + len(lookup.keys) > 4 * self.chunk_keys:
                break
            taken += 1
            keys += len(lookup.keys)
        group, self._lookups = self._lookups[:taken], self._lookups[taken:]
        # Late only while Redis is up: lookups behind a round that opened the breaker miss
        # in _read_group without counting (the failed round counted the outage).
        late = asyncio.get_running_loop().time() - self.timeout_s if self._up else -np.inf
        kept = []
        for lookup in group:
            if lookup.answer.done():
                continue
            if lookup.since < late:
                self._record_error(lookup.namespace, "get")
                lookup.miss()
                continue
            kept.append(lookup)
        return kept

    async def _read_group(self, group: list[_Lookup]) -> None:
        """One round trip for ``group``, each lookup answered with its slice of the values;
        misses when the backend is down (the breaker opened while they waited), no turn
        came, or the round trip failed (one error counted per lookup)."""
        if not group or not self._up:
            return
        errors = self.stats.errors
        values = await self._round_trip(group[0].namespace, [k for x in group for k in x.keys])
        if values is None:
            if self.stats.errors > errors:  # no turn, or the fetch failed: each lookup counts
                for lookup in group[1:]:
                    self._record_error(lookup.namespace, "get")
            return
        offset = 0
        for lookup in group:
            part = values[offset : offset + len(lookup.keys)]
            offset += len(lookup.keys)
            if not lookup.answer.done():  # else its caller was cancelled meanwhile
                lookup.answer.set_result(part)

    async def _put(
        self, namespace: CacheNamespace, ids: np.ndarray, array: np.ndarray, seq: int
    ) -> None:
        if self._closed or not self._usable():
            return
        keys, packed = encode_rows(array, self._keys(namespace, ids), self._integrity_key, seq)
        if not keys:
            return
        expiry: tuple[Any, ...] = ("EX", self.ttl_s) if self.ttl_s else ()
        if not await self._take_turn(namespace, "put"):
            return
        start = time.perf_counter()
        try:
            await self._store(keys, packed, expiry)
        except Exception as exc:  # a cache failure must never fail a request
            self._failed(exc, namespace, "put")
            return
        finally:
            self._turns.release()
        self._reachable("put", time.perf_counter() - start)

    async def check(self) -> str | None:
        """Probe the backend once (:meth:`_ping`), leaving the breaker alone.

        Returns:
            ``None`` if it serves requests, else a one-line reason (no password in it).
        """
        start = time.perf_counter()
        try:
            await asyncio.wait_for(self._ping(), timeout=self.timeout_s * 2)
        except Exception as exc:  # any failure means 'not reachable'
            return reason_of(exc) if not isinstance(exc, TimeoutError) else "timed out"
        self._reachable("ping", time.perf_counter() - start)
        return None

    def mark_unavailable(self, reason: str) -> None:
        """Open the breaker (logs the outage WARNING if it was closed); probes follow."""
        self._open(reason)

    async def close(self) -> None:
        """Stop probing and close the connections."""
        self._closed = True
        loop = asyncio.get_running_loop()
        while self._reader is not None:  # waiting lookups are answered with misses
            reader, self._reader = self._reader, None
            if reader.get_loop() is loop and not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        for lookup in self._lookups:
            if lookup.answer.get_loop() is loop:
                lookup.miss()
        self._lookups.clear()
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        await self._close_client()

    async def _take_turn(self, namespace: CacheNamespace, op: str) -> bool:
        """Wait up to ``timeout_s`` for one of ``max_connections`` turns; False: skip the
        call (counted as an error, logged at most once a minute; the breaker stays)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._turns.acquire()
        except TimeoutError:
            self._record_error(namespace, op)
            self._skip_logger.warning(
                "%s cache at %s: every connection busy for %.2gs; a %s was skipped "
                "(raise cache.redis_max_connections)",
                self.label,
                self.where,
                self.timeout_s,
                op,
            )
            return False
        return True

    # Circuit breaker ---------------------------------------------------------------------

    def _usable(self) -> bool:
        """True if calls should go to the backend now; else maybe start a background probe."""
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
        if isinstance(exc, self.unreachable):
            self._open(reason_of(exc))
            return
        # The backend answered with an error (full under noeviction, read-only replica,
        # ...): keep using it, and say so (the rate-limited logger folds repeats).
        self._skip_logger.warning(
            "%s cache at %s rejected a %s (%s); the call was skipped (rows missed or not stored)",
            self.label,
            self.where,
            op,
            reason_of(exc),
        )

    def _open(self, reason: str) -> None:
        now = time.monotonic()
        self._retry_at = now + self.backoff_s
        if self._up:
            self._up = False
            self._down_since = now
            self._logger.warning(
                "%s cache at %s is unavailable (%s); serving without it and retrying every %.2gs",
                self.label,
                self.where,
                reason,
                self.backoff_s,
            )
        self._report_available(False)

    async def _probe(self) -> None:
        reason = await self.check()
        if reason is not None:
            self._retry_at = time.monotonic() + self.backoff_s
            self._logger.debug(
                "%s cache at %s still unavailable (%s)", self.label, self.where, reason
            )
            return
        if not self._up:
            self._up = True
            self._logger.info(
                "%s cache at %s is reachable again after %.1fs",
                self.label,
                self.where,
                time.monotonic() - self._down_since,
            )
            self._report_available(True)

    def _reachable(self, op: str, seconds: float) -> None:
        """A round trip succeeded: record its latency; report the backend up unless the
        breaker is open (a call sent before it opened may still succeed, e.g. one whose
        keys all live on the masters still up: only the probe closes the breaker)."""
        self._record_operation(op, seconds)
        if self._up:
            self._report_available(True)

    def _report_available(self, up: bool) -> None:
        if self._reported_up is not up:
            self._reported_up = up
            self._record_available(up)
