"""End to end with ``cache.backend: redis-cluster``: a real hopserve server, a real local
Redis Cluster (3 masters, 1 replica each), concurrent clients, and a master SIGKILLed
mid-load: no request fails, every row equals the engine's, and the cache recovers after
the replica takes over.

Real components throughout (see ``conftest.py``); helpers in ``support/e2e.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from support.e2e import ATOL, MODEL, RTOL, expected

from hopserve.server.cache.codec import REJECT_REASONS
from hopserve.testing import LocalRedisCluster

LABELS = {"model": MODEL, "backend": "redis-cluster"}
CLIENTS = 6
IDS_PER_REQUEST = 24


class Load:
    """``CLIENTS`` threads, each sending requests of random IDs until stopped; every
    answer is checked against the engine's rows."""

    def __init__(self, server: Any, all_ids: np.ndarray, want: dict[int, np.ndarray]) -> None:
        self.server, self.all_ids, self.want = server, all_ids, want
        self.done = 0
        self.failures: list[str] = []
        self.wrong_rows = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(seed,), daemon=True) for seed in range(CLIENTS)
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with self.server.client(max_retries=0) as client:
            while not self._stop.is_set():
                ids = rng.choice(self.all_ids, size=IDS_PER_REQUEST, replace=False)
                try:
                    got = client.get_embeddings(MODEL, ids)
                except Exception as exc:  # any failed request is a test failure
                    with self._lock:
                        self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                want = np.stack([self.want[int(i)] for i in ids])
                bad = ~np.isclose(got, want, atol=ATOL, rtol=RTOL).all(axis=1)
                with self._lock:
                    self.done += 1
                    self.wrong_rows += int(bad.sum())

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Keep the load running until ``condition()`` (generous timeout, no timing claim)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
            assert all(t.is_alive() for t in self._threads), "a load thread died"
            time.sleep(0.05)


def test_master_killed_mid_load_fails_no_request_and_serves_no_wrong_row(
    make_config, start_server, redis_cluster_factory, evaluator, all_ids
) -> None:
    cluster: LocalRedisCluster = redis_cluster_factory(replicas=1)
    cache = {
        "backend": "redis-cluster",
        "redis_url": cluster.url,
        "redis_cluster_nodes": cluster.addresses[1:],
        "redis_backoff_s": 0.2,
    }
    server = start_server(make_config(cache=cache))
    want = dict(zip(all_ids.tolist(), expected(evaluator, all_ids), strict=True))
    with server.client() as client:  # fill the cache with every row
        client.get_embeddings(MODEL, all_ids)
        server.drain()
        assert client.get_embeddings_with_info(MODEL, all_ids).cache_hits == len(all_ids)

    def sample(name: str) -> float:
        return server.sample(name, **LABELS)

    with Load(server, all_ids, want) as load:
        load.wait_for(lambda: load.done >= 30, 60, "30 requests answered")
        victim = cluster.primaries()[0]
        cluster.kill(victim)  # SIGKILL, mid-load
        load.wait_for(
            lambda: server.sample("hopserve_cache_up", backend="redis-cluster") == 0,
            30,
            "the cache noticed the dead master (breaker open)",
        )
        cluster.wait_failover(victim)  # a replica is promoted
        load.wait_for(
            lambda: server.sample("hopserve_cache_up", backend="redis-cluster") == 1,
            30,
            "the cache is used again after the failover",
        )
        hits = sample("hopserve_cache_hits_total")
        load.wait_for(
            lambda: sample("hopserve_cache_hits_total") > hits + 10 * IDS_PER_REQUEST,
            30,
            "cache hits after the failover",
        )
        answered = load.done
        load.wait_for(lambda: load.done >= answered + 30, 60, "30 more requests answered")

    assert load.failures == [], load.failures[:5]
    assert load.wrong_rows == 0
    assert load.done >= 90
    assert sample("hopserve_cache_errors_total") > 0
    for reason in REJECT_REASONS:  # nothing refused by the envelope either
        assert server.sample("hopserve_cache_rejected_total", reason=reason, **LABELS) == 0
