"""The near tier in front of a real redis-server: hot rows stay in-process, and the near
tier is never less fresh than Redis."""

from __future__ import annotations

import asyncio

import numpy as np

from hopserve.config.models import CacheConfig
from hopserve.server.cache import CacheNamespace, MemoryEmbeddingCache, RedisEmbeddingCache
from hopserve.server.cache.factory import make_cache
from hopserve.server.cache.tiered import TieredCache

NS = CacheNamespace("cora", "1", "g1", dim=4)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def test_hits_come_from_memory_and_redis_hits_are_promoted(redis_server: str) -> None:
    async def scenario() -> None:
        far = RedisEmbeddingCache(redis_server)
        async with TieredCache(MemoryEmbeddingCache(100), far) as cache:
            ids = np.array([1, 2, 3])
            await cache.put_many(NS, ids, rows(3), seq=4)
            mask, got = await cache.get_many(NS, ids)
            assert mask.all() and got.tobytes() == rows(3).tobytes()
            assert far.hits == 0  # answered in-process: no round trip
            await far.put_many(NS, np.array([7]), rows(1, 1), seq=4)  # another front-end's
            mask, got = await cache.get_many(NS, np.array([7, 8]))
            assert mask.tolist() == [True, False] and far.hits == 1
            mask, _ = await cache.get_many(NS, np.array([7]))
            assert mask.all() and far.hits == 1  # promoted
            assert far.misses == 1  # 8, once

    asyncio.run(scenario())


def test_a_stale_near_row_never_hides_a_fresh_redis_row(redis_server: str) -> None:
    async def scenario() -> None:
        near, far = MemoryEmbeddingCache(100), RedisEmbeddingCache(redis_server)
        async with TieredCache(near, far) as cache:
            ids = np.array([1, 2])
            await near.put_many(NS, ids, rows(2), seq=2)  # computed before an update
            await far.put_many(NS, ids, rows(2, 5), seq=6)  # recomputed after it
            stale_since = np.array([5, 1])  # node 1 changed at 5, node 2 at 1
            mask, got = await cache.get_many(NS, ids, stale_since, max_seq=6)
            assert mask.all()
            assert got[0].tobytes() == rows(2, 5)[0].tobytes()  # Redis' fresh row
            assert got[1].tobytes() == rows(2)[1].tobytes()  # the near row, still valid
            # A row from another history (a later sequence than the graph's) is a miss.
            mask, _ = await cache.get_many(NS, ids, stale_since, max_seq=3)
            assert mask.tolist() == [False, True]

    asyncio.run(scenario())


def test_the_factory_builds_it_only_when_asked(redis_server: str) -> None:
    async def scenario() -> None:
        plain = await make_cache(CacheConfig(backend="redis", redis_url=redis_server))
        tiered = await make_cache(
            CacheConfig(backend="redis", redis_url=redis_server, near_entries=10)
        )
        try:
            assert isinstance(plain, RedisEmbeddingCache)
            assert isinstance(tiered, TieredCache) and tiered.near.max_entries == 10
            assert tiered.name == "redis" and tiered.available
        finally:
            await plain.close()
            await tiered.close()

    asyncio.run(scenario())


def test_lookups_redis_never_answers_are_mostly_skipped_and_resume_when_it_does(
    redis_server: str,
) -> None:
    """One front-end: Redis finds none of the near tier's misses, so after a window only
    1 lookup in ``probe_every`` asks it; the skipped rows are misses (computed by the
    caller) and are still written to Redis. When another front-end writes the rows, the
    probes find them and every lookup asks again."""

    async def scenario() -> None:
        near, far = MemoryEmbeddingCache(1000), RedisEmbeddingCache(redis_server)
        tiered = TieredCache(near, far, far_min_hit_rate=0.5, far_window=8, far_probe_every=4)
        async with tiered as cache:
            for i in range(4):  # 4 lookups of 2 new ids: 8 keys asked, none found
                mask, _ = await cache.get_many(NS, np.array([2 * i, 2 * i + 1]))
                assert not mask.any()
            assert far.misses == 8 and not cache.gate("cora").open
            for i in range(4, 12):  # closed: lookups 4 and 8 of these ask Redis
                mask, _ = await cache.get_many(NS, np.array([2 * i, 2 * i + 1]))
                assert not mask.any()
            assert far.misses == 8 + 2 * 2 and cache.far_skipped == 6 * 2
            await cache.put_many(NS, np.array([100]), rows(1), seq=1)  # still written
            assert (await far.get_many(NS, np.array([100])))[0].all()
            # Another front-end writes rows: the next probes find them, the gate opens.
            other = np.arange(200, 216)
            await far.put_many(NS, other, rows(16), seq=1)
            found = 0
            for i in range(0, 16, 2):
                mask, got = await cache.get_many(NS, other[i : i + 2])
                found += int(mask.sum())
                if mask.any():
                    assert got[mask].tobytes() == rows(16)[i : i + 2][mask].tobytes()
            assert cache.gate("cora").open and found > 0
            mask, _ = await cache.get_many(NS, np.array([214, 215]))
            assert mask.all()  # asked (or promoted): open lookups see every shared row

    asyncio.run(scenario())


def test_a_rate_of_zero_asks_redis_for_every_miss(redis_server: str) -> None:
    async def scenario() -> None:
        near, far = MemoryEmbeddingCache(1000), RedisEmbeddingCache(redis_server)
        async with TieredCache(near, far, far_min_hit_rate=0.0, far_window=2) as cache:
            for i in range(10):
                await cache.get_many(NS, np.array([i]))
            assert far.misses == 10 and cache.far_skipped == 0

    asyncio.run(scenario())


def test_a_redis_outage_does_not_close_the_gate(redis_server: str) -> None:
    """Lookups that fail (Redis unreachable: every key a miss) say nothing of its hit
    rate: the gate stays open, so Redis is asked again as soon as it is back."""

    async def scenario() -> None:
        near = MemoryEmbeddingCache(1000)
        far = RedisEmbeddingCache("redis://127.0.0.1:1/0", timeout_s=0.05, backoff_s=60)
        async with TieredCache(near, far, far_min_hit_rate=0.5, far_window=4) as cache:
            for i in range(12):
                mask, _ = await cache.get_many(NS, np.array([2 * i, 2 * i + 1]))
                assert not mask.any()
            assert cache.gate("cora").open and cache.far_skipped == 0

    asyncio.run(scenario())
