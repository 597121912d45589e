"""Grouped lookups of the Redis cache (``RedisBackedCache._get``): concurrent lookups share
one round trip and each gets exactly its own rows; callers cancelled at each await, a hung
Redis and ``close`` never strand or mix up the others."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio.client
from support.redis_pipelines import count_pipeline_executions

from hopserve.server.cache import CacheNamespace, RedisEmbeddingCache

WIDE = CacheNamespace("cora", "1", "g1", dim=8)
NARROW = CacheNamespace("arxiv", "3", "g7", dim=4)


def rows_of(ids: np.ndarray, dim: int) -> np.ndarray:
    """A row per id that names it: ``id + k / 10`` in column ``k``."""
    return ids[:, None].astype(np.float32) + np.arange(dim, dtype=np.float32) / 10


def check(result: tuple[np.ndarray, np.ndarray], ids: np.ndarray, stored: int, dim: int) -> None:
    """Ids below ``stored`` hit with their own rows; the others miss with zero rows."""
    mask, rows = result
    assert mask.tolist() == (ids < stored).tolist()
    expected = np.where(mask[:, None], rows_of(ids, dim), 0.0)
    assert rows.shape == (len(ids), dim)
    assert rows.tobytes() == expected.astype(np.float32).tobytes()


async def fill(cache: RedisEmbeddingCache, stored: int = 100) -> None:
    ids = np.arange(stored)
    await cache.put_many(WIDE, ids, rows_of(ids, WIDE.dim), seq=1)
    await cache.put_many(NARROW, ids, rows_of(ids, NARROW.dim), seq=1)


def lookups(count: int, seed: int = 0) -> list[tuple[CacheNamespace, np.ndarray]]:
    """``count`` lookups alternating namespaces (widths 8 and 4), hits and misses mixed."""
    rng = np.random.default_rng(seed)
    return [
        ((WIDE, NARROW)[i % 2], rng.choice(150, size=int(rng.integers(1, 20)), replace=False))
        for i in range(count)
    ]


def test_concurrent_lookups_share_one_round_trip_and_each_gets_its_rows(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            await fill(cache)
            sent = count_pipeline_executions(monkeypatch)
            wanted = lookups(30)
            results = await asyncio.gather(*(cache.get_many(ns, ids) for ns, ids in wanted))
            for (ns, ids), result in zip(wanted, results, strict=True):
                check(result, ids, 100, ns.dim)
            assert sent == [1]  # 30 lookups, one pipeline of one MGET
            keys = sum(len(ids) for _, ids in wanted)
            hits = sum(int((ids < 100).sum()) for _, ids in wanted)
            assert (cache.hits, cache.misses) == (hits, keys - hits)  # counted per lookup

    asyncio.run(scenario())
    assert redis.Redis.from_url(redis_server).info("commandstats")["cmdstat_mget"]["calls"] == 1


def test_lookups_made_during_a_round_go_together_in_the_next(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server) as cache:
            await fill(cache)
            sent = count_pipeline_executions(monkeypatch)
            first = asyncio.ensure_future(cache.get_many(WIDE, np.arange(5)))
            while not sent:  # the first round is on the wire
                await asyncio.sleep(0)
            wanted = lookups(12, seed=1)
            results = await asyncio.gather(*(cache.get_many(ns, ids) for ns, ids in wanted))
            check(await first, np.arange(5), 100, WIDE.dim)
            for (ns, ids), result in zip(wanted, results, strict=True):
                check(result, ids, 100, ns.dim)
            assert sent == [1, 1]  # the 12 waited for the first round, then went as one

    asyncio.run(scenario())


def test_a_round_holds_at_most_four_mget_chunks_of_keys_and_large_lookups_go_alone(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server, chunk_keys=10) as cache:
            await fill(cache)
            sent = count_pipeline_executions(monkeypatch)
            wanted = [np.arange(9 * i, 9 * i + 9) for i in range(5)] + [np.arange(50, 140)]
            results = await asyncio.gather(*(cache.get_many(WIDE, ids) for ids in wanted))
            for ids, result in zip(wanted, results, strict=True):
                check(result, ids, 100, WIDE.dim)
            # the 90-key lookup: its own 9 MGETs; the 9-key ones: 36 keys (4 MGETs), then 9
            assert sorted(sent) == [1, 4, 9]

    asyncio.run(scenario())


class SlowRounds(RedisEmbeddingCache):
    """Real Redis, each fetch ``delay_s`` slower (a loaded Redis that still answers)."""

    delay_s = 0.6

    async def _fetch(self, keys: list[str]) -> Any:
        await asyncio.sleep(self.delay_s)
        return await super()._fetch(keys)


def test_a_lookup_that_waited_a_timeout_for_its_round_is_skipped(redis_server: str) -> None:
    """Rounds of 0.6 s, timeout 1 s: the lookups that fit the second round (waited 0.6 s)
    are sent; those left for the third (waited 1.2 s) miss at once, each counted."""

    async def scenario() -> None:
        async with SlowRounds(redis_server, chunk_keys=10, timeout_s=1.0) as cache:
            await fill(cache)
            first = asyncio.ensure_future(cache.get_many(WIDE, np.arange(5)))
            await asyncio.sleep(0.1)  # the first round is on the wire
            queued = [np.arange(9 * i, 9 * i + 9) for i in range(8)]  # 4 fit a round
            results = await asyncio.gather(*(cache.get_many(WIDE, ids) for ids in queued))
            check(await first, np.arange(5), 100, WIDE.dim)
            for ids, result in zip(queued[:4], results[:4], strict=True):
                check(result, ids, 100, WIDE.dim)
            assert not any(mask.any() for mask, _ in results[4:])
            assert cache.errors == 4 and cache.available

    asyncio.run(scenario())


def test_a_large_lookup_does_not_wait_behind_a_round(redis_server: str) -> None:
    """Lookups of ``chunk_keys`` keys or more are round trips of their own: started while
    a 0.6 s round is on the wire, one takes its own 0.6 s, not 1.2 s."""

    async def scenario() -> None:
        async with SlowRounds(redis_server, chunk_keys=10, timeout_s=5.0) as cache:
            await fill(cache)
            first = asyncio.ensure_future(cache.get_many(WIDE, np.arange(5)))
            await asyncio.sleep(0.1)  # the first round is on the wire
            start = asyncio.get_running_loop().time()
            check(await cache.get_many(WIDE, np.arange(20)), np.arange(20), 100, WIDE.dim)
            assert asyncio.get_running_loop().time() - start < 1.0
            check(await first, np.arange(5), 100, WIDE.dim)

    asyncio.run(scenario())


def test_the_breaker_opening_while_a_call_waits_for_its_turn_skips_the_call(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_server, max_connections=1, timeout_s=5.0) as cache:
            await fill(cache)
            sent = count_pipeline_executions(monkeypatch)
            await cache._turns.acquire()  # the only connection is busy
            waiting = asyncio.ensure_future(cache.get_many(WIDE, np.arange(3)))
            for _ in range(5):
                await asyncio.sleep(0)
            cache.mark_unavailable("a test")
            cache._turns.release()
            mask, _ = await waiting
            assert not mask.any() and sent == []

    asyncio.run(scenario())


def test_a_reader_left_on_a_closed_loop_does_not_strand_later_lookups(redis_server: str) -> None:
    """A loop stopped mid-round without cancelling its tasks (run_until_complete, then
    close): the next loop's lookups start a reader of their own, and close() works."""
    cache = SlowRounds(redis_server, timeout_s=1.0)
    old = asyncio.new_event_loop()
    old.run_until_complete(fill(cache))
    with pytest.raises(TimeoutError):
        old.run_until_complete(asyncio.wait_for(cache.get_many(WIDE, np.arange(3)), 0.05))
    old.close()  # the reader is still pending on it

    async def later() -> tuple[np.ndarray, np.ndarray]:
        return await asyncio.wait_for(cache.get_many(NARROW, np.arange(4)), 5.0)

    mask, rows = asyncio.run(later())
    assert rows.shape == (4, NARROW.dim)  # answered (hits if the pool's sockets survived)
    asyncio.run(cache.close())


def test_after_close_lookups_and_stores_do_nothing(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        cache = RedisEmbeddingCache(redis_server)
        await fill(cache)
        await cache.close()
        sent = count_pipeline_executions(monkeypatch)
        mask, _ = await cache.get_many(WIDE, np.arange(3))
        await cache.put_many(WIDE, np.arange(3), rows_of(np.arange(3), WIDE.dim))
        assert not mask.any() and sent == [] and cache._reader is None

    asyncio.run(scenario())


@pytest.mark.parametrize("when", ["waiting for its round", "during its round trip"])
def test_a_cancelled_caller_leaves_the_others_answered(redis_outage: Any, when: str) -> None:
    """Cancelled at each await of a lookup: before its round is sent (it waits behind a
    round in flight) and while its round, shared with another lookup, is on the wire
    (Redis paused meanwhile)."""

    async def scenario() -> None:
        async with RedisEmbeddingCache(redis_outage.url, timeout_s=10.0) as cache:
            await fill(cache)
            redis_outage.pause()  # every round now waits on the wire until resumed
            try:
                first_round = [  # made in one tick: one round
                    asyncio.ensure_future(cache.get_many(WIDE, np.arange(90, 110))),
                    asyncio.ensure_future(cache.get_many(NARROW, np.arange(3))),
                ]
                for _ in range(5):
                    await asyncio.sleep(0)  # the first round is sent
                second_round = [
                    asyncio.ensure_future(cache.get_many(WIDE, np.arange(95, 105))),
                    asyncio.ensure_future(cache.get_many(NARROW, np.arange(97, 102))),
                ]
                for _ in range(5):
                    await asyncio.sleep(0)
                victim = (first_round if when == "during its round trip" else second_round)[0]
                victim.cancel()
                await asyncio.sleep(0.05)
            finally:
                redis_outage.resume()
            with pytest.raises(asyncio.CancelledError):
                await victim
            expected = {
                0: (np.arange(90, 110), WIDE),
                1: (np.arange(3), NARROW),
                2: (np.arange(95, 105), WIDE),
                3: (np.arange(97, 102), NARROW),
            }
            for i, task in enumerate(first_round + second_round):
                if task is not victim:
                    ids, ns = expected[i]
                    check(await task, ids, 100, ns.dim)
            check(await cache.get_many(WIDE, np.arange(98, 103)), np.arange(98, 103), 100, 8)
            assert cache.available and cache.errors == 0

    asyncio.run(scenario())


def test_lookups_queued_behind_a_hung_round_miss_without_another_timeout(
    redis_outage: Any,
) -> None:
    """The hung round costs its own timeout and opens the breaker; the lookups that waited
    behind it are answered with misses at once, never sent (one error, not three)."""

    async def scenario() -> None:
        cache = RedisEmbeddingCache(redis_outage.url, timeout_s=0.2, backoff_s=60)
        await fill(cache)
        redis_outage.pause()
        try:
            hung = asyncio.ensure_future(cache.get_many(WIDE, np.arange(5)))
            for _ in range(5):
                await asyncio.sleep(0)
            queued = [cache.get_many(WIDE, np.arange(5, 9)), cache.get_many(NARROW, np.arange(3))]
            results = await asyncio.gather(hung, *queued)
        finally:
            redis_outage.resume()
        assert not any(mask.any() for mask, _ in results)
        assert not cache.available and cache.errors == 1
        await cache.close()

    asyncio.run(scenario())


def test_close_answers_waiting_lookups_with_misses(redis_outage: Any) -> None:
    """Those in the round on the wire and those queued behind it."""

    async def scenario() -> None:
        cache = RedisEmbeddingCache(redis_outage.url, timeout_s=10.0)
        await fill(cache)
        redis_outage.pause()
        try:
            on_the_wire = asyncio.ensure_future(cache.get_many(WIDE, np.arange(3)))
            for _ in range(5):
                await asyncio.sleep(0)
            queued = [asyncio.ensure_future(cache.get_many(WIDE, np.arange(i, i + 3)))
                      for i in range(1, 4)]  # fmt: skip
            for _ in range(5):
                await asyncio.sleep(0)
            await asyncio.wait_for(cache.close(), 5.0)
            results = await asyncio.wait_for(asyncio.gather(on_the_wire, *queued), 5.0)
        finally:
            redis_outage.resume()
        assert all(not mask.any() and rows.shape == (3, 8) for mask, rows in results)

    asyncio.run(scenario())
