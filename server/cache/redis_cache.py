"""Redis-backed embedding cache: pipelined MGET / SET EX behind the shared circuit breaker.

One :meth:`~RedisEmbeddingCache.get_many` is one round trip (a pipeline of MGETs of at
most ``chunk_keys`` keys each); one :meth:`~RedisEmbeddingCache.put_many` is one round
trip (a pipeline of ``SET key value EX ttl``). redis-py uses the hiredis reply parser
automatically when ``hiredis`` is installed (``redis.utils.HIREDIS_AVAILABLE``).

Envelopes, the bound on concurrent round trips and the circuit breaker (a dead or hung
Redis costs a request at most one timeout and never fails it) are
:class:`~.redis_base.RedisBackedCache`'s; this module only talks to one Redis.

Eviction: run Redis with ``maxmemory`` set and ``maxmemory-policy allkeys-lru`` (or
``volatile-lru`` if the Redis is shared and ``ttl_s > 0``); see ``server/cache/README.md``.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from hopserve.config.types import SecretUrl, redact_url
from hopserve.server.cache.base import CacheObserver
from hopserve.server.cache.redis_base import CLIENT_EXTRAS, RedisBackedCache

__all__ = ["RedisEmbeddingCache"]


class RedisEmbeddingCache(RedisBackedCache):
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
    label = "Redis"

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
        secret = url.get_secret_value() if isinstance(url, SecretUrl) else url
        super().__init__(
            redact_url(secret),
            ttl_s=ttl_s,
            prefix=prefix,
            timeout_s=timeout_s,
            backoff_s=backoff_s,
            chunk_keys=chunk_keys,
            max_connections=max_connections,
            integrity_key=integrity_key,
            observer=observer,
        )
        self.url = self.where
        """The URL with its password redacted (safe to log)."""
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            secret,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the breaker decides when to try again
            max_connections=max_connections,
            health_check_interval=0,
            **CLIENT_EXTRAS,
        )

    def __repr__(self) -> str:
        state = "up" if self.available else "down"
        return f"RedisEmbeddingCache(url={self.url!r}, ttl_s={self.ttl_s}, {state})"

    async def _fetch(self, keys: list[str]) -> list[bytes | None]:
        """One pipelined round trip of MGETs."""
        async with self._client.pipeline(transaction=False) as pipe:
            for first in range(0, len(keys), self.chunk_keys):
                pipe.mget(keys[first : first + self.chunk_keys])
            replies = await pipe.execute()
        return list(chain.from_iterable(replies))

    async def _store(self, keys: list[str], values: list[bytes], expiry: tuple[Any, ...]) -> None:
        """One pipelined round trip of SET EX."""
        async with self._client.pipeline(transaction=False) as pipe:
            for key, value in zip(keys, values, strict=True):
                pipe.execute_command("SET", key, value, *expiry)
            await pipe.execute()

    async def _ping(self) -> None:
        await self._client.ping()

    async def _close_client(self) -> None:
        await self._client.aclose()
