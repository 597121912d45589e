"""Several versions of one model on one graph, and a front-end in a thread serving them.

:func:`write_versions` writes a graph store (non-identity external IDs) and one weights
file per version of ``TinySAGE`` (``support.servable``), each from its own seed, with
each version's full-graph forward as the reference the served rows must equal.
:class:`ServiceThread` runs a real :class:`~hopserve.server.app.Service` (in-process
worker, grpc.aio on loopback) on its own event loop, so tests use the blocking SDK.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hopserve import GraphStore
from hopserve.client import AdminClient, EmbeddingClient
from hopserve.config import HopserveConfig
from hopserve.server.app import Service, build_server
from hopserve.testing import free_port
from support.servable import ENTRYPOINT, TinySAGE

MODEL = "tiny"
ATOL, RTOL = 1e-5, 1e-4


@dataclass
class Versions:
    """A graph and one weights file per model version, with their references."""

    root: Path
    graph_dir: Path
    kwargs: dict[str, int]
    external_ids: np.ndarray  # every node's external ID
    weights: dict[str, Path] = field(default_factory=dict)
    reference: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)

    def add(self, version: str, seed: int) -> None:
        """Write the weights of ``version`` (``TinySAGE`` seeded with ``seed``)."""
        torch.manual_seed(seed)
        model = TinySAGE(**self.kwargs).eval()
        path = self.root / f"weights-v{version}.pt"
        torch.save(model.state_dict(), path)
        store = GraphStore.open(self.graph_dir)
        with torch.no_grad():
            out = model(store.features.float(), store.edge_index()).numpy()
        ids = store.to_external(torch.arange(store.num_nodes)).numpy()
        self.weights[version] = path
        self.reference[version] = {int(i): out[r] for r, i in enumerate(ids)}

    def rows(self, version: str, ids: Sequence[int]) -> np.ndarray:
        """What ``version`` must answer for ``ids`` (its own full-graph forward)."""
        return np.stack([self.reference[version][int(i)] for i in ids])

    def matches(self, version: str, ids: Sequence[int], rows: np.ndarray) -> bool:
        """Whether ``rows`` are ``version``'s rows of ``ids``."""
        return bool(np.allclose(rows, self.rows(version, ids), atol=ATOL, rtol=RTOL))

    def entry(self, version: str, /, **update: Any) -> dict[str, Any]:
        """A ``models:`` entry serving ``version``."""
        return {
            "name": MODEL,
            "version": version,
            "entrypoint": ENTRYPOINT,
            "kwargs": self.kwargs,
            "weights": str(self.weights[version]),
            "graph": str(self.graph_dir),
        } | update

    def config(
        self,
        versions: Sequence[str] = ("1",),
        default: str | None = None,
        cache: dict[str, Any] | None = None,
        security: dict[str, Any] | None = None,
        **server: Any,
    ) -> HopserveConfig:
        """Serve ``versions`` (``default`` marked when several) on free loopback ports."""
        models = [
            self.entry(v, **({"default": True} if v == default and len(versions) > 1 else {}))
            for v in versions
        ]
        return HopserveConfig.model_validate(
            {
                "models": models,
                "server": {
                    "host": "127.0.0.1",
                    "port": free_port(),
                    "metrics_port": 0,
                    "max_wait_ms": 2,
                    "grace_period_s": 1,
                }
                | server,
                "cache": cache or {"backend": "memory"},
                "security": security or {},
            }
        )


def write_versions(
    root: Path,
    versions: dict[str, int] | None = None,
    *,
    num_nodes: int = 200,
    num_edges: int = 1200,
    in_dim: int = 6,
    nan_features: bool = False,
) -> Versions:
    """A graph store under ``root/graph`` and the weights of ``versions`` (version -> seed;
    default ``{"1": 1, "2": 2}``); ``nan_features``: every feature is NaN (every served
    row is; a model's load-time check on its probe graph still passes)."""
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    x = torch.randn(num_nodes, in_dim, generator=gen)
    if nan_features:
        x.fill_(float("nan"))
    external = np.arange(num_nodes, dtype=np.int64) * 10 + 7
    graph_dir = root / "graph"
    GraphStore.from_edge_index(edge_index, x, node_ids=torch.from_numpy(external)).save(
        graph_dir, progress=False
    )
    made = Versions(root, graph_dir, {"in_dim": in_dim, "hidden": 8, "out_dim": 4}, external)
    for version, seed in (versions or {"1": 1, "2": 2}).items():
        made.add(version, seed)
    return made


class ServiceThread:
    """A :class:`Service` running on its own event loop in a daemon thread."""

    def __init__(self, config: HopserveConfig, expect_ready: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.service: Service = self.call(lambda: build_server(config))
        self.call(self.service.start)
        ready = self.call(lambda: self.service.wait_ready(60))
        assert ready == expect_ready, [(m.name, m.state, m.error) for m in self.service.models]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    def call(self, fn: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 120) -> Any:
        """Run ``fn()`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def sample(self, name: str, **labels: str) -> float | None:
        """A metric sample from the server's registry (None when absent)."""
        return self.service.metrics.registry.get_sample_value(name, labels)

    def client(self, **kw: Any) -> EmbeddingClient:
        return EmbeddingClient(self.target, **({"timeout": 30.0} | kw))

    def admin(self, **kw: Any) -> AdminClient:
        return AdminClient(self.target, **({"timeout": 120.0} | kw))

    def health(self, service: str) -> str:
        """The ``grpc.health.v1`` status name of ``service`` ("SERVICE_UNKNOWN" if none)."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return "SERVICE_UNKNOWN"
                raise
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def stop(self, grace: float = 1.0) -> None:
        """Stop the service gracefully and end the loop thread (idempotent)."""
        if not self._thread.is_alive():
            return
        try:
            self.call(lambda: self.service.stop(grace))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
