"""A live hopserve + Prometheus on loopback: what the deploy tests and screenshots run on.

Everything is real and local: a small synthetic graph store and saved GraphSAGE weights
(``hopserve.examples:GraphSAGE``), a front-end built with ``build_server`` and run on its
own event loop in a thread, a private ``redis-server`` as cache when one is installed
(the in-process LRU otherwise), a closed-loop client load with cached repeats, unknown
node IDs and an unknown model (so error series exist), and ``/usr/bin/prometheus``
scraping the front-end every second with ``deploy/prometheus/alerts.yml`` loaded. The
scrape configuration is derived from ``deploy/prometheus/prometheus.yml`` (same job
names), only targets, intervals and paths change.

Used by ``tests/deploy/test_live_prometheus.py`` and ``deploy/grafana/render_panels.py``::

    with LiveStack(workdir) as stack:
        stack.load.start()                  # background load until stack.close()
        stack.wait_for_scrapes(5)
        stack.prometheus.query("sum(rate(hopserve_requests_total[15s]))")
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from live_prometheus import (
    PrometheusProcess,
    prometheus_config,
    samples,
)

from hopserve.testing import RedisServer, free_port

MODEL = "sage"
NUM_NODES = 20_000
NUM_EDGES = 200_000
FEATURES = 32
KWARGS = {"in_dim": FEATURES, "hidden": 64, "out_dim": 16, "num_layers": 2}
ID_OFFSET = 1_000_000  # external ID of caller node i is ID_OFFSET + 3 * i


# ---------------------------------------------------------------------------- servable


@dataclass(frozen=True)
class Servable:
    """A graph store and weights on disk, and the external IDs of its nodes."""

    graph_dir: Path
    weights: Path
    node_ids: np.ndarray


def write_servable(root: Path, seed: int = 0) -> Servable:
    """Write ``root/graph`` (synthetic, RCMK-ordered) and ``root/sage.pt``."""
    import torch

    from hopserve import GraphStore
    from hopserve.examples import GraphSAGE

    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, NUM_NODES, (2, NUM_EDGES), generator=gen)
    x = torch.randn(NUM_NODES, FEATURES, generator=gen)
    ids = ID_OFFSET + 3 * np.arange(NUM_NODES, dtype=np.int64)
    graph_dir = root / "graph"
    if not graph_dir.exists():
        store = GraphStore.from_edge_index(edge_index, x, node_ids=torch.from_numpy(ids))
        store.save(graph_dir, progress=False)
    weights = root / "sage.pt"
    if not weights.exists():
        torch.manual_seed(seed)
        torch.save(GraphSAGE(**KWARGS).state_dict(), weights)
    return Servable(graph_dir, weights, ids)


# ---------------------------------------------------------------------------- hopserve


class ServerThread:
    """A hopserve front-end (``build_server``) on its own event loop in a daemon thread."""

    def __init__(self, config: Any) -> None:
        from hopserve.server.app import build_server

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.service = self.call(lambda: build_server(config))
        self.call(self.service.start)
        if not self.call(lambda: self.service.wait_ready(120), timeout=130):
            states = [(m.name, m.state, m.error) for m in self.service.models]
            self.stop()
            raise RuntimeError(f"hopserve did not become ready: {states}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.service.metrics_port}"

    def call(self, fn: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 60) -> Any:
        """Run ``fn()`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.call(lambda: self.service.stop(1.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


def hopserve_config(servable: Servable, cache: dict[str, Any]) -> Any:
    """A :class:`HopserveConfig` serving :data:`MODEL` on free loopback ports."""
    from hopserve.config import HopserveConfig

    return HopserveConfig.model_validate(
        {
            "models": [
                {
                    "name": MODEL,
                    "version": "1",
                    "entrypoint": "hopserve.examples:GraphSAGE",
                    "kwargs": KWARGS,
                    "weights": str(servable.weights),
                    "graph": str(servable.graph_dir),
                }
            ],
            "server": {
                "host": "127.0.0.1",
                "port": free_port(),
                "metrics_port": free_port(),
                "max_wait_ms": 5.0,
                "max_batch_targets": 512,
                "grace_period_s": 1.0,
            },
            "cache": cache,
            "engine": {"memory_budget_bytes": "64MiB"},
        }
    )


# ---------------------------------------------------------------------------- load


@dataclass
class LoadCounts:
    """What the load generator sent, by outcome (``ok`` or the client error's code)."""

    sent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, outcome: str) -> None:
        self.sent += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@dataclass(eq=False)
class Load:
    """Closed-loop client load in a background thread, until :meth:`stop`.

    ``concurrency`` async clients send Zipf-distributed target sets (hot nodes repeat,
    so the cache hits), every ``stream_every``-th request streams, every
    ``bad_every``-th asks for an unknown node ID (INVALID_ARGUMENT) and every
    ``unknown_model_every``-th for a model that is not served (NOT_FOUND). With a
    ``corrupt`` callback, it is called every ``corrupt_every`` requests (to make cache
    errors). ``pause_s`` between requests keeps CPU for Prometheus on small machines;
    ``phases`` (``[(seconds from start, concurrency), ...]``) change the concurrency over
    time; ``zipf_a`` is the popularity exponent of the target nodes.
    """

    target: str
    node_ids: np.ndarray = field(repr=False)
    _: KW_ONLY
    concurrency: int = 4
    set_size: int = 24
    pause_s: float = 0.005
    bad_every: int = 25
    unknown_model_every: int = 60
    stream_every: int = 10
    corrupt: Callable[[], None] | None = None
    corrupt_every: int = 100
    update_every: int = 20  # client 0 adds an edge every this many requests (0 = never)
    compact_every: int = 5  # ... and compacts every this many updates
    phases: list[tuple[float, int]] | None = None  # (seconds from start, concurrency) steps
    zipf_a: float = 1.0
    seed: int = 0
    counts: LoadCounts = field(default_factory=LoadCounts, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _error: BaseException | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.phases = self.phases or []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hopserve-load", daemon=True)
        self._thread.start()

    def wait_for(self, requests: int, timeout: float = 60.0) -> None:
        """Block until at least ``requests`` requests were answered."""
        deadline = time.monotonic() + timeout
        while self.counts.sent < requests:
            self._raise()
            if time.monotonic() > deadline:
                raise TimeoutError(f"load sent {self.counts.sent} of {requests} requests")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"load generator failed: {self._error!r}") from self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # reported by wait_for / stop
            self._error = err

    async def _main(self) -> None:
        from hopserve.client.aio import AsyncEmbeddingClient
        from hopserve.client.loadtest import LoadSpec, TargetSampler

        spec = LoadSpec(
            model=MODEL,
            set_size=self.set_size,
            set_size_sigma=0.8,
            zipf_a=self.zipf_a,
            seed=self.seed,
        )
        sampler = TargetSampler(self.node_ids, spec)
        bad_id = int(self.node_ids.max()) + 1
        started = time.monotonic()
        async with AsyncEmbeddingClient(self.target, timeout=30.0, max_retries=0) as client:
            await client.wait_until_ready(60)
            workers = max([self.concurrency, *(c for _, c in self.phases)])
            await asyncio.gather(
                *(self._client_loop(client, sampler, bad_id, i, started) for i in range(workers))
            )

    def _active(self, index: int, started: float) -> bool:
        """Whether client ``index`` runs now (``phases`` change the concurrency over time)."""
        concurrency = self.concurrency
        elapsed = time.monotonic() - started
        for at, level in self.phases:
            if elapsed >= at:
                concurrency = level
        return index < concurrency

    async def _update(self, admin: Any, rng: np.random.Generator, count: int) -> None:
        """One graph update (an edge between two existing nodes), and a compaction every
        ``compact_every`` updates: the graph-update panels get data."""
        src, dst = rng.choice(self.node_ids, size=(2, 1))
        await admin.update_graph(MODEL, add_edges=(src, dst))
        if self.compact_every and count % self.compact_every == 0:
            await admin.compact_graph(MODEL)

    async def _client_loop(
        self, client: Any, sampler: Any, bad_id: int, index: int, started: float
    ) -> None:
        from hopserve.client.admin import AsyncAdminClient

        updates, rng = 0, np.random.default_rng(self.seed + index)
        admin = AsyncAdminClient(self.target, timeout=30.0) if index == 0 else None
        try:
            await self._loop(client, sampler, bad_id, index, started, admin, rng, updates)
        finally:
            if admin is not None:
                await admin.close()

    async def _loop(  # noqa: PLR0913 - the loop's state
        self, client: Any, sampler: Any, bad_id: int, index: int, started: float,
        admin: Any, rng: np.random.Generator, updates: int,
    ) -> None:  # fmt: skip
        from hopserve.client.errors import HopserveError

        while not self._stop.is_set():
            if not self._active(index, started):
                await asyncio.sleep(0.1)
                continue
            n = self.counts.sent + 1
            ids = sampler.draw()
            model = MODEL
            if self.bad_every and n % self.bad_every == 0:
                ids = np.append(ids, bad_id)
            elif self.unknown_model_every and n % self.unknown_model_every == 0:
                model = "no-such-model"
            try:
                if self.stream_every and n % self.stream_every == 0:
                    async for _ in client.stream_embeddings(model, ids):
                        pass
                else:
                    await client.get_embeddings(model, ids)
            except HopserveError as err:
                code = err.code.name.lower() if err.code is not None else "unknown"
                self.counts.add(code)
            else:
                self.counts.add("ok")
            if self.corrupt is not None and n % self.corrupt_every == 0:
                await asyncio.to_thread(self.corrupt)
            if admin is not None and self.update_every and n % self.update_every == 0:
                updates += 1
                await self._update(admin, rng, updates)
            await asyncio.sleep(self.pause_s)


# ---------------------------------------------------------------------------- stack


class LiveStack:
    """Servable + cache + front-end + Prometheus; :attr:`load` drives traffic."""

    def __init__(self, workdir: Path, *, use_redis: bool | None = None, **load: Any) -> None:
        self.workdir = workdir
        self._closers: list[Callable[[], None]] = []
        try:
            self.servable = write_servable(workdir / "model")
            if use_redis is None:
                use_redis = shutil.which("redis-server") is not None
            self.redis: RedisServer | None = None
            corrupt = None
            if use_redis:
                self.redis = RedisServer.launch(workdir / "redis", maxmemory="64mb")
                self._closers.append(self.redis.stop)
                cache = {"backend": "redis", "redis_url": self.redis.url, "ttl_s": 600}
                corrupt = self._corrupt_some_keys
            else:
                cache = {"backend": "memory", "memory_max_entries": NUM_NODES // 3}
            self.cache_backend = cache["backend"]
            self.config = hopserve_config(self.servable, cache)
            self.server = ServerThread(self.config)
            self._closers.append(self.server.stop)
            self.prometheus = PrometheusProcess(
                workdir / "prometheus", prometheus_config(self.server.metrics_target)
            )
            self._closers.append(self.prometheus.stop)
            self.load = Load(self.server.target, self.servable.node_ids, corrupt=corrupt, **load)
            self._closers.append(self.load.stop)
            self.started = time.time()
        except BaseException:
            self.close()
            raise

    def _corrupt_some_keys(self) -> None:
        """Overwrite a few cached rows with bytes of the wrong length: the front-end
        counts them in ``hopserve_cache_errors_total`` and recomputes them."""
        assert self.redis is not None
        with self.redis.client() as client:
            _, keys = client.scan(0, match="hopserve:*", count=200)
            for key in keys[:5]:
                client.set(key, b"corrupt", ex=60)

    def wait_for_scrapes(self, count: int, timeout: float = 60.0) -> None:
        """Wait until Prometheus holds ``count`` scrapes of answered requests."""
        expr = 'max(count_over_time(hopserve_requests_total{outcome="ok"}[1h]))'
        deadline = time.monotonic() + timeout
        while True:
            values = samples(self.prometheus.query(expr))
            if values and max(values) >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Prometheus has {values} scrapes with traffic; targets: "
                    f"{self.prometheus.targets()}; log: {self.prometheus.log()}"
                )
            time.sleep(0.5)

    def close(self) -> None:
        """Stop everything started, newest first (never raises from a failed stop)."""
        while self._closers:
            closer = self._closers.pop()
            with contextlib.suppress(Exception):
                closer()

    def __enter__(self) -> LiveStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
