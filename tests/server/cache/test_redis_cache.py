"""RedisEmbeddingCache against a real redis-server: bytes, keys, TTL, pipelining, outages."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import redis.asyncio.client
from support.redis_pipelines import count_pipeline_executions

from hopserve.server.cache import CacheNamespace, RedisEmbeddingCache
from hopserve.server.cache.codec import make_keys

NS = CacheNamespace("cora", "1", "g1", dim=8)
LOGGER = "hopserve.server.cache.redis_cache"


def random_rows(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


async def wait_until(
    condition: Callable[[], Awaitable[bool]], timeout_s: float = 5.0, step_s: float = 0.05
) -> float:
    """Poll ``condition`` until true; return the seconds it took (fail after timeout_s)."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s}s")
        await asyncio.sleep(step_s)
    return time.monotonic() - start


def test_round_trip_exact_bytes(redis_server: str) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            ids = np.array([5, 1, 99, 1_000_000_007], dtype=np.int64)
            rows = random_rows(4)
            await cache.put_many(NS, ids, rows)
            mask, got = await cache.get_many(NS, ids[::-1])
            assert mask.all()
            assert got.dtype == np.float32
            assert got.tobytes() == rows[::-1].tobytes()  # bit-exact, not approximately

    run(scenario)


def test_stored_value_is_packed_little_endian_float32(redis_server: str) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server, prefix="hs") as cache:
            rows = random_rows(1)
            await cache.put_many(NS, np.array([42]), rows.astype(np.float64))
        raw = redis.Redis.from_url(redis_server).get("hs:cora:1:g1:exact:42")
        assert raw.startswith(b"HSE\x02\x01")  # envelope format 2, float32
        assert raw.endswith(rows[0].astype("<f4").tobytes()) and len(raw) == 36 + NS.dim * 4

    run(scenario)


def test_hit_and_miss_masks(redis_server: str) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            rows = random_rows(3)
            await cache.put_many(NS, np.array([1, 2, 3]), rows)
            mask, got = await cache.get_many(NS, np.array([0, 1, 7, 3, 1]))
            assert mask.tolist() == [False, True, False, True, True]
            np.testing.assert_array_equal(got[[1, 3, 4]], rows[[0, 2, 0]])
            assert not got[[0, 2]].any()
            assert (cache.hits, cache.misses, cache.errors) == (3, 2, 0)
            empty_mask, empty_rows = await cache.get_many(NS, np.array([], dtype=np.int64))
            assert empty_mask.shape == (0,) and empty_rows.shape == (0, 8)

    run(scenario)


@pytest.mark.parametrize(
    "other",
    [
        CacheNamespace("cora", "2", "g1", dim=8),
        CacheNamespace("cora", "1", "g2", dim=8),
        CacheNamespace("cora", "1", "g1", dim=8, variant="f10-5.s0"),
        CacheNamespace("citeseer", "1", "g1", dim=8),
    ],
    ids=["model_version", "graph_version", "variant", "model"],
)
def test_versioned_keys_isolate(redis_server: str, other: CacheNamespace) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            await cache.put_many(NS, np.array([1, 2]), random_rows(2))
            mask, _ = await cache.get_many(other, np.array([1, 2]))
            assert not mask.any()
            assert (await cache.get_many(NS, np.array([1, 2])))[0].all()

    run(scenario)


def test_ttl_is_set(redis_server: str) -> None:
    async def scenario() -> None:
        # a generous call timeout: this test is about TTLs, and a loaded machine must not
        # turn the writes into timed-out (dropped) ones
        async with RedisEmbeddingCache(redis_server, ttl_s=120, timeout_s=10) as cache:
            await cache.put_many(NS, np.array([1, 2]), random_rows(2))
            assert cache.errors == 0
        async with RedisEmbeddingCache(
            redis_server, ttl_s=0, prefix="forever", timeout_s=10
        ) as cache:
            await cache.put_many(NS, np.array([1]), random_rows(1))
        client = redis.Redis.from_url(redis_server)
        for key in make_keys("hopserve", NS, np.array([1, 2])):
            assert 110 <= client.ttl(key) <= 120
        assert client.ttl(make_keys("forever", NS, np.array([1]))[0]) == -1  # no expiry

    run(scenario)


def test_one_round_trip_per_call_with_chunked_mget(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, chunk = 2500, 1000
    executions = count_pipeline_executions(monkeypatch)

    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server, chunk_keys=chunk) as cache:
            await cache.put_many(NS, np.arange(n), random_rows(n))
            assert executions == [n]  # one pipeline of n SET commands
            mask, _ = await cache.get_many(NS, np.arange(n))
            assert mask.all()
            assert executions == [n, 3]  # one pipeline of ceil(n / chunk) MGETs

    run(scenario)
    stats = redis.Redis.from_url(redis_server).info("commandstats")
    assert stats["cmdstat_mget"]["calls"] == 3
    assert stats["cmdstat_set"]["calls"] == n
    assert "cmdstat_get" not in stats


def test_corrupt_value_is_a_miss_and_an_error(redis_server: str) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            await cache.put_many(NS, np.array([1, 2]), random_rows(2))
            client = redis.Redis.from_url(redis_server)
            client.set(make_keys("hopserve", NS, np.array([1]))[0], b"short")
            mask, got = await cache.get_many(NS, np.array([1, 2]))
            assert mask.tolist() == [False, True]
            assert not got[0].any()
            assert (cache.errors, cache.hits, cache.misses) == (1, 1, 1)

    run(scenario)


@pytest.mark.parametrize("fill", [np.nan, 0.0, 1e30, np.inf])
def test_values_overwritten_in_redis_are_never_returned(redis_server: str, fill: float) -> None:
    """Regression: values overwritten with NaN, zeros or 1e30 of the right length were
    served as embeddings (429 of 429)."""

    async def scenario() -> None:
        n = 64
        async with RedisEmbeddingCache(redis_server) as cache:
            ids = np.arange(n)
            await cache.put_many(NS, ids, random_rows(n))
            client = redis.Redis.from_url(redis_server)
            for key in make_keys("hopserve", NS, ids):
                value = client.get(key)
                row = np.full(NS.dim, fill, dtype="<f4").tobytes()
                client.set(key, value[: len(value) - len(row)] + row)  # same length
            mask, got = await cache.get_many(NS, ids)
            assert not mask.any() and not got.any()
            assert cache.stats.rejected == n and cache.misses == n

    run(scenario)


class RecordingObserver:
    """A CacheObserver that keeps the events it receives."""

    def __init__(self) -> None:
        self.available: list[bool] = []
        self.errors = 0
        self.ops: list[str] = []

    def cache_lookup(self, backend: str, model: str, hits: int, misses: int) -> None:
        assert (backend, model) == ("redis", NS.model)

    def cache_error(self, backend: str, model: str, op: str, count: int) -> None:
        self.errors += count

    def cache_operation(self, backend: str, op: str, seconds: float) -> None:
        self.ops.append(op)

    def cache_available(self, backend: str, up: bool) -> None:
        self.available.append(up)


def test_outage_then_recovery(redis_outage: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Killed Redis: misses and dropped stores, no exception, one WARNING; then recovery."""
    ids, rows = np.arange(10), random_rows(10)
    observer = RecordingObserver()

    async def scenario() -> None:
        cache = RedisEmbeddingCache(
            redis_outage.url, timeout_s=0.2, backoff_s=0.2, observer=observer
        )
        await cache.put_many(NS, ids, rows)
        assert (await cache.get_many(NS, ids))[0].all()

        redis_outage.stop()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            for _ in range(20):
                mask, got = await cache.get_many(NS, ids)
                assert not mask.any() and not got.any()
                await cache.put_many(NS, ids, rows)
                await asyncio.sleep(0.02)  # spans a few backoff windows
            assert cache.errors >= 1 and not cache.available
            assert cache.misses == 20 * len(ids)
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]
            assert "unavailable" in warnings[0].getMessage()

            redis_outage.start()  # same port, empty (no persistence)

            async def refilled() -> bool:
                await cache.put_many(NS, ids, rows)
                return bool((await cache.get_many(NS, ids))[0].all())

            await wait_until(refilled)
            assert cache.available
            recovered = [r for r in caplog.records if "reachable again" in r.getMessage()]
            assert len(recovered) == 1 and recovered[0].levelno == logging.INFO

            # A second outage is a new outage: exactly one more WARNING.
            redis_outage.stop()
            for _ in range(5):
                await cache.get_many(NS, ids)
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 2
        await cache.close()

    run(scenario)
    assert observer.available == [True, False, True, False]  # transitions only
    assert observer.errors >= 2 and {"put", "get", "ping"} <= set(observer.ops)


def test_error_reply_counts_but_keeps_redis_in_use(
    redis_outage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A full Redis under noeviction rejects writes: errors counted, lookups still served."""
    ids = np.arange(4)

    async def scenario() -> None:
        cache = RedisEmbeddingCache(redis_outage.url)
        await cache.put_many(NS, ids, random_rows(4))
        with redis_outage.client() as client:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1)  # already over: every write is refused
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for _ in range(3):
                await cache.put_many(NS, np.arange(10, 14), random_rows(4))
                assert (await cache.get_many(NS, ids))[0].all()  # reads still work
        assert cache.available and cache.errors == 3
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "maxmemory" in warnings[0]
        await cache.close()

    run(scenario)


def test_hung_redis_costs_one_timeout_then_nothing(redis_outage: Any) -> None:
    """SIGSTOPped Redis (accepts, never answers): the breaker keeps latency off requests."""
    ids = np.arange(100)

    async def scenario() -> None:
        cache = RedisEmbeddingCache(redis_outage.url, timeout_s=0.1, backoff_s=0.3)
        await cache.put_many(NS, ids, random_rows(100))
        redis_outage.pause()
        try:
            start = time.perf_counter()
            mask, _ = await cache.get_many(NS, ids)
            first = time.perf_counter() - start
            assert not mask.any()
            assert first < 1.0  # one socket timeout (0.1 s) plus slack
            start = time.perf_counter()
            for _ in range(50):
                mask, _ = await cache.get_many(NS, ids)
                await cache.put_many(NS, ids, random_rows(100))
                assert not mask.any()
            skipped = time.perf_counter() - start
            assert skipped < 0.5  # 100 calls that never touch Redis
        finally:
            redis_outage.resume()

        async def hits() -> bool:
            return bool((await cache.get_many(NS, ids))[0].all())

        await wait_until(hits)  # data survived: the process was only paused
        await cache.close()

    run(scenario)


def test_password_never_logged(redis_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = redis_factory(password="s3cret-pw")

    async def scenario() -> None:
        cache = RedisEmbeddingCache(server.url, timeout_s=0.2, backoff_s=0.1)
        await cache.put_many(NS, np.array([1]), random_rows(1))  # authenticated round trip
        assert (await cache.get_many(NS, np.array([1])))[0].all()
        assert "s3cret-pw" not in repr(cache) and "***" in cache.url
        server.stop()
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            for _ in range(5):
                await cache.get_many(NS, np.array([1]))
                await asyncio.sleep(0.05)
        assert "unavailable" in caplog.text
        assert "s3cret-pw" not in caplog.text
        assert f"redis://:***@127.0.0.1:{server.port}/0" in caplog.text
        await cache.close()

    run(scenario)


def test_uses_hiredis_parser(redis_server: str) -> None:
    from redis.utils import HIREDIS_AVAILABLE

    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            await cache.get_many(NS, np.array([1]))
            connection = cache._client.connection_pool.make_connection()
            expected = "Hiredis" if HIREDIS_AVAILABLE else "RESP"
            assert expected in type(connection._parser).__name__

    run(scenario)


def test_a_burst_of_lookups_waits_for_connections_and_never_opens_the_breaker(
    redis_server: str,
) -> None:
    """Regression: redis-py's pool raises MaxConnectionsError at 100 connections instead
    of waiting; the cache took that for an outage and skipped Redis for a second."""

    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server, timeout_s=2.0) as cache:
            ids = np.arange(64)
            await cache.put_many(NS, ids, random_rows(64))
            results = await asyncio.gather(*(cache.get_many(NS, ids) for _ in range(300)))
            assert all(mask.all() for mask, _ in results)
            assert cache.available and cache.errors == 0

    run(scenario)


def test_no_free_turn_within_the_timeout_skips_the_call_but_redis_stays_in_use(
    redis_server: str,
) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server, max_connections=1, timeout_s=0.1) as cache:
            await cache.put_many(NS, np.array([1]), random_rows(1))
            await cache._turns.acquire()  # the only connection is busy
            mask, _ = await cache.get_many(NS, np.array([1]))
            assert not mask.any() and cache.errors == 1 and cache.available
            cache._turns.release()
            assert (await cache.get_many(NS, np.array([1])))[0].all()

    run(scenario)


def test_a_call_finishing_after_the_breaker_opened_does_not_report_it_up(
    redis_server: str,
) -> None:
    """A get sent before the breaker opened may still succeed (on a cluster, one whose keys
    all live on the masters still up): ``hopserve_cache_up`` must stay 0 until a probe
    closes the breaker, not flip back to 1 while nothing is sent."""

    async def scenario() -> None:
        observer = RecordingObserver()
        async with RedisEmbeddingCache(redis_server, backoff_s=60, observer=observer) as cache:
            await cache.put_many(NS, np.array([1]), random_rows(1))
            assert observer.available[-1] is True
            in_flight = asyncio.ensure_future(cache.get_many(NS, np.array([1])))
            await asyncio.sleep(0)  # the get joins the next round of lookups ...
            await asyncio.sleep(0)  # ... which is sent and waits for its answer
            cache.mark_unavailable("a master died")  # the breaker opens meanwhile
            mask, _ = await in_flight
            assert mask.all()  # the in-flight get succeeded ...
            assert observer.available[-1] is False  # ... and did not report the cache up
            assert not cache.available

    run(scenario)
