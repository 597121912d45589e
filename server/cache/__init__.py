"""Embedding cache of the front-end: Redis or Redis Cluster (shared, versioned keys),
in-process LRU, none.

Keys are ``{prefix}:{model}:{model_version}:{graph_version}:{variant}:{node_id}``, so a
new model version, graph version or sampling variant can never be answered with an older
embedding; old keys simply age out. Values are one float32 row in an integrity envelope
(:mod:`.codec`): a value that fails its check is a miss, recomputed and overwritten. Caches never fail a request: backend errors become misses (and dropped stores),
are counted in :class:`CacheStats` and reported to an optional :class:`CacheObserver`.

Redis eviction policy: give Redis a ``maxmemory`` and ``maxmemory-policy allkeys-lru``
(every hopserve key is a recomputable copy, so evicting the least recently used is always
safe, with or without TTLs). Use ``volatile-lru`` only when the Redis also holds data that
must never be evicted and ``cache.ttl_s > 0`` (then only keys with a TTL, i.e. ours, are
evicted). Never keep Redis's default ``noeviction``: once full, every write-back fails.
Persistence is unnecessary (``save ""``, ``appendonly no``). See ``server/cache/README.md``.
"""

from hopserve.server.cache.base import CacheNamespace, CacheObserver, CacheStats, EmbeddingCache
from hopserve.server.cache.factory import make_cache
from hopserve.server.cache.memory import MemoryEmbeddingCache
from hopserve.server.cache.null import NullCache
from hopserve.server.cache.redis_cache import RedisEmbeddingCache
from hopserve.server.cache.redis_cluster import RedisClusterEmbeddingCache

__all__ = [
    "CacheNamespace",
    "CacheObserver",
    "CacheStats",
    "EmbeddingCache",
    "MemoryEmbeddingCache",
    "NullCache",
    "RedisClusterEmbeddingCache",
    "RedisEmbeddingCache",
    "make_cache",
]
