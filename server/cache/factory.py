"""Build the cache named by :class:`~hopserve.config.CacheConfig`."""

from __future__ import annotations

import logging
from pathlib import Path

from hopserve.config.errors import ConfigError
from hopserve.config.models import CacheConfig
from hopserve.server.cache.base import CacheObserver, EmbeddingCache
from hopserve.server.cache.memory import MemoryEmbeddingCache
from hopserve.server.cache.null import NullCache
from hopserve.server.cache.redis_base import RedisBackedCache
from hopserve.server.cache.redis_cache import RedisEmbeddingCache
from hopserve.server.cache.redis_cluster import RedisClusterEmbeddingCache
from hopserve.server.cache.tiered import TieredCache

__all__ = ["make_cache", "read_integrity_key"]

MIN_KEY_BYTES = 16

logger = logging.getLogger(__name__)


async def make_cache(
    config: CacheConfig, *, observer: CacheObserver | None = None
) -> EmbeddingCache:
    """Create the configured cache (call from the server's event loop at start-up).

    - ``"redis"``: a :class:`RedisEmbeddingCache`; if Redis does not answer a PING now it
      is still used: the outage is logged once and the cache recovers when Redis is up.
    - ``"redis-cluster"``: a :class:`RedisClusterEmbeddingCache`, used like ``"redis"``
      when the cluster does not answer now.
    - ``"auto"``: Redis if it answers a PING within ``redis_timeout_s``, otherwise a
      :class:`MemoryEmbeddingCache` (with an INFO line saying why).
    - ``"memory"``: a :class:`MemoryEmbeddingCache` of ``memory_max_entries`` rows.
    - ``"none"``: a :class:`NullCache`.
    """
    if config.backend == "none":
        logger.info("embedding cache disabled (cache.backend=none)")
        return NullCache(observer=observer)
    if config.backend == "memory":
        return _memory(config, observer, "cache.backend=memory")
    common = {
        "ttl_s": config.ttl_s,
        "prefix": config.key_prefix,
        "timeout_s": config.redis_timeout_s,
        "backoff_s": config.redis_backoff_s,
        "max_connections": config.redis_max_connections,
        "integrity_key": read_integrity_key(config.integrity_key_file),
        "observer": observer,
    }
    cache: RedisBackedCache
    if config.backend == "redis-cluster":
        try:
            cache = RedisClusterEmbeddingCache(
                config.redis_url, nodes=config.redis_cluster_nodes, **common
            )
        except ValueError as err:
            raise ConfigError(f"cache.redis_url: {err}") from None
    else:
        cache = RedisEmbeddingCache(config.redis_url, **common)
    reason = await cache.check()
    if reason is None:
        logger.info("embedding cache: %s at %s (ttl %ds)", cache.label, cache.where, config.ttl_s)
        return _with_near_tier(cache, config, observer)
    if config.backend in ("redis", "redis-cluster"):
        cache.mark_unavailable(f"no answer at start-up: {reason}")
        return _with_near_tier(cache, config, observer)
    await cache.close()
    return _memory(config, observer, f"cache.backend=auto and Redis at {cache.url}: {reason}")


def read_integrity_key(path: Path | None) -> bytes | None:
    """The secret in ``path`` (surrounding whitespace stripped), or ``None`` without a file.

    Raises:
        ConfigError: unreadable, or shorter than 16 bytes (the secret is never shown).
    """
    if path is None:
        return None
    try:
        secret = path.read_bytes().strip()
    except OSError as err:
        raise ConfigError(
            f"cache.integrity_key_file: cannot read {str(path)!r} ({err.strerror})"
        ) from None
    if len(secret) < MIN_KEY_BYTES:
        raise ConfigError(
            f"cache.integrity_key_file: {str(path)!r} holds {len(secret)} bytes; use a "
            f"random secret of at least {MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`)"
        )
    return secret


def _with_near_tier(
    cache: RedisBackedCache, config: CacheConfig, observer: CacheObserver | None
) -> EmbeddingCache:
    """``cache`` behind an in-process near tier of ``cache.near_entries`` rows, if any."""
    if not config.near_entries:
        return cache
    logger.info("embedding cache: near tier of %d rows in this process", config.near_entries)
    ttl = config.ttl_s or None
    near = MemoryEmbeddingCache(config.near_entries, ttl_s=ttl, observer=observer)
    return TieredCache(near, cache, far_min_hit_rate=config.far_min_hit_rate, observer=observer)


def _memory(config: CacheConfig, observer: CacheObserver | None, why: str) -> MemoryEmbeddingCache:
    logger.info(
        "embedding cache: in-process memory LRU of %d rows (%s)", config.memory_max_entries, why
    )
    ttl = config.ttl_s or None
    return MemoryEmbeddingCache(config.memory_max_entries, ttl_s=ttl, observer=observer)
