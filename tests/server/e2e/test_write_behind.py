"""End to end: the cache write-behind under a hung Redis.

While a write to Redis is in flight, the rows of later write-backs wait in the edge's
queue (group commit); past ``MAX_PENDING_WRITE_ROWS`` queued rows new ones are dropped
(a later miss recomputes them), requests are still answered, and once Redis answers
again the queue drains and takes rows again.

Real redis-server (SIGSTOPped by ``redis_outage.pause()``: it accepts, never answers) and
the real gRPC server of ``conftest.py``. The cap is lowered for the test: 200,000 rows
would take hundreds of requests on the 300-node graph; the rule is the same. The edge
counts dropped rows (``hopserve_cache_writeback_dropped_rows_total``), and Redis shows
them: the rows queued within the cap are written once Redis answers, the later ones never
are.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.e2e import ATOL, MODEL, RTOL, expected

from hopserve.server import edge

CAP = 80  # MAX_PENDING_WRITE_ROWS for the test
GROUP = 40  # rows one request writes back (distinct ids, policy REFRESH: no cache read)
TIMEOUT_S = 10.0  # redis_timeout_s (its maximum): how long the write waits on the hung Redis
ATTEMPTS = 3


def test_a_full_write_behind_queue_drops_new_rows_and_drains_when_redis_answers(
    make_config, start_server, redis_outage, evaluator, all_ids, monkeypatch
) -> None:
    monkeypatch.setattr(edge, "MAX_PENDING_WRITE_ROWS", CAP)
    server = start_server(
        make_config(cache={"redis_url": redis_outage.url, "redis_timeout_s": TIMEOUT_S})
    )
    # 0: its write goes out and hangs; 1, 2: queued (80 rows, the cap); 3, 4: past it.
    groups = [all_ids[GROUP * k : GROUP * (k + 1)] for k in range(5)]
    queued, dropped = np.concatenate(groups[:3]), np.concatenate(groups[3:])

    def drain() -> None:
        server.call(lambda: server.service.edge.drain(60), timeout=90)

    with server.client() as client, redis_outage.client() as redis:
        client.get_embeddings(MODEL, all_ids[-5:], cache_policy="refresh")  # connected, up
        drain()
        for _ in range(ATTEMPTS):
            redis.flushall()
            dropped_before = _dropped(server)
            start = time.monotonic()
            redis_outage.pause()
            try:
                for ids in groups:  # served while Redis hangs, queue full or not
                    got = client.get_embeddings(MODEL, ids, cache_policy="refresh")
                    np.testing.assert_allclose(got, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
            finally:
                redis_outage.resume()
            if time.monotonic() - start < TIMEOUT_S - 1:
                break  # the hung write cannot have timed out: the queue stayed behind it
            # A very slow run: the write may have timed out, opening the breaker, which
            # drops the queued rows. Inconclusive: wait until the cache is back, retry.
            drain()
            deadline = time.monotonic() + 60
            while server.sample("hopserve_cache_up", backend="redis") != 1:
                assert time.monotonic() < deadline, "the cache did not come back"
                time.sleep(0.1)
        else:
            pytest.fail(f"{ATTEMPTS} attempts each took over {TIMEOUT_S - 1} s to send 5 requests")

        assert _dropped(server) - dropped_before == len(dropped)  # counted, by model
        drain()  # the hung write completes, then the queued rows go out
        assert redis.dbsize() == len(queued), "only the rows queued within the cap are written"
        again = client.get_embeddings_with_info(MODEL, dropped)
        assert again.cache_hits == 0  # dropped: never written, recomputed now
        np.testing.assert_allclose(
            again.embeddings, expected(evaluator, dropped), atol=ATOL, rtol=RTOL
        )
        assert client.get_embeddings_with_info(MODEL, queued).cache_hits == len(queued)

        drain()  # the queue is empty again and takes new rows: those just recomputed
        assert redis.dbsize() == len(queued) + len(dropped)
        assert client.get_embeddings_with_info(MODEL, dropped).cache_hits == len(dropped)


def _dropped(server) -> float:  # noqa: ANN001 - the conftest's running server
    return server.sample("hopserve_cache_writeback_dropped_rows_total", model=MODEL) or 0.0
