"""RedisClusterEmbeddingCache against a real local Redis Cluster: bytes, hash-tagged keys,
per-master pipelines, the integrity envelope, a killed master, failover and recovery."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import redis
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot

from hopserve.config import CacheConfig
from hopserve.server.cache import CacheNamespace, RedisClusterEmbeddingCache, make_cache
from hopserve.server.cache.codec import make_cluster_keys
from hopserve.testing import LocalRedisCluster

NS = CacheNamespace("cora", "1", "g1", dim=8)
LOGGER = "hopserve.server.cache.redis_cluster"


def random_rows(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def cache_for(cluster: LocalRedisCluster, **kwargs: Any) -> RedisClusterEmbeddingCache:
    return RedisClusterEmbeddingCache(cluster.url, nodes=cluster.addresses[1:], **kwargs)


def raw_client(cluster: LocalRedisCluster) -> redis.RedisCluster:
    """A synchronous cluster client, for reading and tampering with stored values."""
    return redis.RedisCluster.from_url(cluster.url, socket_timeout=5)


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Poll ``condition`` until true (fail after ``timeout_s``: generous, never a timing
    assertion)."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.05)


def test_round_trip_exact_bytes_on_every_master(redis_cluster: LocalRedisCluster) -> None:
    n = 2000
    ids = np.arange(n) * 7 + 3
    rows = random_rows(n)

    async def scenario() -> None:
        async with cache_for(redis_cluster, ttl_s=120) as cache:
            await cache.put_many(NS, ids, rows)
            mask, got = await cache.get_many(NS, ids[::-1])
            assert mask.all() and got.dtype == np.float32
            assert got.tobytes() == rows[::-1].tobytes()  # bit-exact
            mask, got = await cache.get_many(NS, np.array([ids[5], 1, ids[9]]))
            assert mask.tolist() == [True, False, True]
            np.testing.assert_array_equal(got[[0, 2]], rows[[5, 9]])
            for other in (
                CacheNamespace("cora", "2", "g1", dim=8),
                CacheNamespace("cora", "1", "g2", dim=8),
                CacheNamespace("cora", "1", "g1", dim=8, variant="f10-5.s0"),
            ):
                assert not (await cache.get_many(other, ids[:50]))[0].any()
            assert (cache.hits, cache.errors) == (n + 2, 0)

    run(scenario)
    client = raw_client(redis_cluster)
    key = f"hopserve:{{cora:1:g1:exact:{ids[0] % 256}}}:{ids[0]}"
    assert client.get(key).startswith(b"HSE\x02\x01")  # the envelope of a single Redis
    assert 110 <= client.ttl(key) <= 120
    for port in redis_cluster.primaries():  # the rows are spread over every master
        with redis_cluster.node(port).client() as node:
            assert node.dbsize() > n / 10


def test_one_lookup_groups_into_few_slots_one_round_trip_per_master(
    redis_cluster: LocalRedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, buckets = 5000, 16
    ids = np.random.default_rng(1).choice(10**9, size=n, replace=False)
    keys = make_cluster_keys("hopserve", NS, ids, buckets)
    slots = {key_slot(k.encode()) for k in keys}
    assert len(slots) <= buckets  # 5,000 keys in at most 16 slots
    assert all(k.count("{") == 1 and NS.model in k[k.index("{") :] for k in keys)

    pipelines: list[tuple[str, int]] = []  # (node, commands) per round trip
    original = ClusterNode.execute_pipeline

    async def execute_pipeline(self: ClusterNode, commands: list[Any]) -> bool:
        pipelines.append((self.name, len(commands)))
        return await original(self, commands)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", execute_pipeline)

    async def scenario() -> None:
        async with cache_for(redis_cluster, buckets=buckets) as cache:
            await cache.put_many(NS, ids, random_rows(n))
            assert len({node for node, _ in pipelines}) == len(pipelines) <= 3
            assert sum(count for _, count in pipelines) == n  # one SET EX per row
            pipelines.clear()
            assert (await cache.get_many(NS, ids))[0].all()
            assert len({node for node, _ in pipelines}) == len(pipelines) <= 3
            assert sum(count for _, count in pipelines) == len(slots)  # one MGET per slot

    run(scenario)
    mgets = sets = 0
    for port in redis_cluster.primaries():
        with redis_cluster.node(port).client() as node:
            stats = node.info("commandstats")
        mgets += stats.get("cmdstat_mget", {}).get("calls", 0)
        sets += stats.get("cmdstat_set", {}).get("calls", 0)
    assert (mgets, sets) == (len(slots), n)


def test_tampered_values_are_misses_never_rows(redis_cluster: LocalRedisCluster) -> None:
    ids = np.arange(6)
    rows = random_rows(6)
    keys = make_cluster_keys("hopserve", NS, ids, 256)

    async def scenario() -> None:
        async with cache_for(redis_cluster, integrity_key=b"k" * 32) as cache:
            await cache.put_many(NS, ids, rows)
            client = raw_client(redis_cluster)
            value = client.get(keys[0])
            flipped = bytearray(value)
            flipped[-1] ^= 1
            client.set(keys[0], bytes(flipped))  # a bit flipped in the row
            client.set(keys[1], client.get(keys[2]))  # another node's row
            client.set(keys[3], b"short")  # not an envelope
            forged = value[:-32] + np.full(8, 1e30, "<f4").tobytes()
            client.set(keys[4], forged)  # same length, payload replaced
            mask, got = await cache.get_many(NS, ids)
            assert mask.tolist() == [False, False, True, False, False, True]
            assert not got[[0, 1, 3, 4]].any()
            np.testing.assert_array_equal(got[[2, 5]], rows[[2, 5]])
            assert cache.stats.rejected == 4 and cache.available

            await cache.put_many(NS, ids, rows)  # the write-back overwrites them
            mask, got = await cache.get_many(NS, ids)
            assert mask.all() and got.tobytes() == rows.tobytes()

    run(scenario)


def test_factory_builds_the_cluster_cache(redis_cluster: LocalRedisCluster) -> None:
    async def scenario() -> None:
        config = CacheConfig(
            backend="redis-cluster",
            redis_url=redis_cluster.url,
            redis_cluster_nodes=redis_cluster.addresses[1:3],
            ttl_s=60,
        )
        cache = await make_cache(config)
        assert isinstance(cache, RedisClusterEmbeddingCache) and cache.available
        assert cache.name == "redis-cluster" and cache.ttl_s == 60
        await cache.put_many(NS, np.arange(3), random_rows(3))
        assert (await cache.get_many(NS, np.arange(3)))[0].all()
        await cache.close()

    run(scenario)


def test_unreachable_cluster_at_start_up_is_used_once_it_answers(
    unused_redis_url: str,
) -> None:
    async def scenario() -> None:
        cache = await make_cache(
            CacheConfig(backend="redis-cluster", redis_url=unused_redis_url.removesuffix("/0"))
        )
        assert isinstance(cache, RedisClusterEmbeddingCache) and not cache.available
        mask, _ = await cache.get_many(NS, np.arange(4))  # a miss, no exception
        assert not mask.any()
        await cache.close()

    run(scenario)


def test_bad_seed_address_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="expected 'host:port' \\(got 'nope'\\)"):
        RedisClusterEmbeddingCache("redis://127.0.0.1:7000", nodes=["nope"])
    with pytest.raises(ValueError, match="cannot use 'redis://:\\*\\*\\*@h:1/2'"):
        RedisClusterEmbeddingCache("redis://:pw@h:1/2")


def test_killed_master_misses_then_recovers_after_failover(
    redis_cluster_factory: Callable[..., LocalRedisCluster], caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILLed master: no exception, wrong row or second WARNING; its replica takes
    over and the cache is used again."""
    cluster = redis_cluster_factory(replicas=1)
    ids, rows = np.arange(300), random_rows(300)

    async def scenario() -> None:
        cache = cache_for(cluster, backoff_s=0.1)
        await cache.put_many(NS, ids, rows)
        assert (await cache.get_many(NS, ids))[0].all()

        victim = cluster.primaries()[0]
        with caplog.at_level(logging.INFO, logger=LOGGER):
            cluster.kill(victim)

            async def breaker_open() -> bool:
                mask, got = await cache.get_many(NS, ids)
                np.testing.assert_array_equal(got[mask], rows[mask])  # hits are right
                await cache.put_many(NS, ids, rows)
                return not cache.available

            await wait_until(breaker_open)
            cluster.wait_failover(victim)

            async def refilled() -> bool:
                await cache.put_many(NS, ids, rows)
                mask, got = await cache.get_many(NS, ids)
                np.testing.assert_array_equal(got[mask], rows[mask])
                return bool(mask.all())

            await wait_until(refilled)
            assert cache.available and cache.errors >= 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "Redis Cluster cache" in warnings[0], warnings
        assert "unavailable" in warnings[0]
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        await cache.close()

    run(scenario)


def test_master_without_replica_killed_and_restarted(
    redis_cluster_factory: Callable[..., LocalRedisCluster],
) -> None:
    """No replica: the cluster is down (CLUSTERDOWN everywhere) until the master is back;
    the cache misses meanwhile and is used again once the cluster is whole."""
    cluster = redis_cluster_factory(replicas=0)
    ids, rows = np.arange(100), random_rows(100)

    async def scenario() -> None:
        cache = cache_for(cluster, backoff_s=0.1)
        await cache.put_many(NS, ids, rows)
        victim = cluster.primaries()[1]
        cluster.kill(victim)

        async def breaker_open() -> bool:
            mask, got = await cache.get_many(NS, ids)
            np.testing.assert_array_equal(got[mask], rows[mask])
            return not cache.available

        await wait_until(breaker_open)
        cluster.restart(victim)  # empty (no persistence), same node id from nodes.conf
        cluster.wait_healthy()

        async def refilled() -> bool:
            await cache.put_many(NS, ids, rows)
            mask, got = await cache.get_many(NS, ids)
            np.testing.assert_array_equal(got[mask], rows[mask])
            return bool(mask.all())

        await wait_until(refilled)
        assert cache.available
        await cache.close()

    run(scenario)
