"""Fixtures of the end-to-end front-end tests: a real hopserve server in a thread.

Everything is real: a graph-store directory on disk, a PyG GraphSAGE with saved weights
loaded through its entrypoint, the in-process worker and engine, the grpc.aio server on
loopback, and the session's private redis-server (``redis_proc`` from
``tests/server/conftest.py``). The server runs on its own event loop in a background
thread (:class:`ServerThread`), so tests use the blocking client SDK as a user would.

- ``graph_dir``, ``weights``, ``evaluator`` (session): the graph, the model's weights and
  the engine run directly on them (``LayerwiseEvaluator``), which gives the expected rows.
- ``make_config(cache=..., model=..., **server)``: a :class:`HopserveConfig` serving
  model ``"sage"`` on free loopback ports.
- ``served`` (module): a started server with the Redis cache, 20 ms batching window.
- ``start_server(config, expect_ready=True)``: more servers, stopped at teardown;
  ``launch`` (session) is the same without the teardown.
- ``all_ids``: every external node ID.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.models import build

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.client import EmbeddingClient
from hopserve.config import HopserveConfig
from hopserve.server.app import Service, build_server
from hopserve.testing import free_port

MODEL = "sage"
NUM_NODES = 300
FEATURES = 8
ID_OFFSET = 10_000  # external ID of storage row i is ID_OFFSET + 7 * i (not the row index)
ENTRYPOINT = "support.models:GraphSAGE"
KWARGS = {"d_in": FEATURES, "hidden": 16, "d_out": 5, "aggr": "mean"}


def external_ids() -> np.ndarray:
    """Every node's external ID, in row order."""
    return ID_OFFSET + 7 * np.arange(NUM_NODES, dtype=np.int64)


@pytest.fixture(scope="session")
def graph_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(0, NUM_NODES, (1500,), generator=gen)
    dst = torch.randint(0, NUM_NODES, (1500,), generator=gen)
    x = torch.randn(NUM_NODES, FEATURES, generator=gen)
    store = GraphStore.from_edge_index(
        torch.stack([src, dst]), x, node_ids=torch.from_numpy(external_ids())
    )
    path = tmp_path_factory.mktemp("graph") / "g"
    store.save(path, progress=False)
    return path


@pytest.fixture(scope="session")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build("sage_mean", FEATURES)
    path = tmp_path_factory.mktemp("weights") / "sage.pt"
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture(scope="session")
def evaluator(graph_dir: Path, weights: Path) -> LayerwiseEvaluator:
    """The engine run directly (no server) on the same graph and weights."""
    from support.models import GraphSAGE

    model = GraphSAGE(**KWARGS)
    model.load_state_dict(torch.load(weights, weights_only=True))
    return LayerwiseEvaluator(model.eval(), GraphStore.open(graph_dir), progress=False)


def hopserve_config(
    graph_dir: Path,
    weights: Path,
    default_cache: dict[str, Any],
    *,
    cache: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    **server: Any,
) -> HopserveConfig:
    """Serve ``"sage"`` on loopback (free ports, 20 ms batching window)."""
    model_cfg = {
        "name": MODEL,
        "version": "1",
        "entrypoint": ENTRYPOINT,
        "kwargs": KWARGS,
        "weights": str(weights),
        "graph": str(graph_dir),
    }
    server_cfg = {
        "host": "127.0.0.1",
        "port": free_port(),
        "metrics_port": free_port(),
        "max_wait_ms": 20,
        "grace_period_s": 1,
    }
    cache_cfg = dict(default_cache)
    if (cache or {}).get("backend", "redis") != "redis":
        cache_cfg = {}
    return HopserveConfig.model_validate(
        {
            "models": [model_cfg | (model or {})],
            "server": server_cfg | server,
            "cache": cache_cfg | (cache or {}),
        }
    )


@pytest.fixture(scope="session")
def default_cache(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The session's redis-server as cache, or the in-process LRU without redis-server
    (tests that need Redis ask for the Redis fixtures themselves and skip)."""
    if shutil.which("redis-server") is None:
        return {"backend": "memory"}
    redis_proc = request.getfixturevalue("redis_proc")
    return {"backend": "redis", "redis_url": redis_proc.url, "redis_backoff_s": 0.2}


@pytest.fixture(scope="session")
def make_config(
    graph_dir: Path, weights: Path, default_cache: dict[str, Any]
) -> Callable[..., HopserveConfig]:
    """``make_config(cache=..., model=..., **server)``: see :func:`hopserve_config`."""

    def make(**kw: Any) -> HopserveConfig:
        return hopserve_config(graph_dir, weights, default_cache, **kw)

    return make


class ServerThread:
    """A hopserve :class:`Service` running on its own event loop in a daemon thread."""

    def __init__(self, config: HopserveConfig, expect_ready: bool | None = True) -> None:
        """``expect_ready``: what ``wait_ready`` must answer; None: do not wait."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.service: Service = self.call(lambda: build_server(config))
        self.call(self.service.start)
        if expect_ready is None:
            return
        ready = self.call(lambda: self.service.wait_ready(60))
        assert ready == expect_ready, [(m.name, m.state, m.error) for m in self.service.models]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    def call(self, fn: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 60) -> Any:
        """Run ``fn()`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def sample(self, name: str, **labels: str) -> float:
        """A metric sample from the server's registry (0 when absent)."""
        value = self.service.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)

    def drain(self) -> None:
        """Wait for the cache write-backs scheduled so far."""
        self.call(lambda: self.service.edge.drain(10))

    def client(self, **kw: Any) -> EmbeddingClient:
        return EmbeddingClient(self.target, **({"timeout": 30.0} | kw))

    def stop(self, grace: float = 1.0) -> None:
        """Stop the service gracefully and end the loop thread (idempotent)."""
        if not self._thread.is_alive():
            return
        try:
            self.call(lambda: self.service.stop(grace))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


@pytest.fixture(scope="session")
def launch() -> Callable[..., ServerThread]:
    """``launch(config, expect_ready=True)``: a started :class:`ServerThread` (the caller
    stops it)."""
    return ServerThread


@pytest.fixture
def start_server() -> Iterator[Callable[..., ServerThread]]:
    """Like ``launch``, and every server started is stopped at teardown."""
    servers: list[ServerThread] = []

    def start(config: HopserveConfig, expect_ready: bool | None = True) -> ServerThread:
        servers.append(ServerThread(config, expect_ready))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def served(make_config: Callable[..., HopserveConfig]) -> Iterator[ServerThread]:
    """The module's main server: Redis cache, 20 ms batching window, batches of at most
    64 targets, defaults otherwise."""
    server = ServerThread(make_config(max_batch_targets=64))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def all_ids() -> np.ndarray:
    """Every external node ID of the test graph, in storage-row order."""
    return external_ids()
