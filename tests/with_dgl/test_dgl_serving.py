"""DGL models served end to end: client SDK → gRPC → front-end → in-process worker → engine.

Everything is real: a graph store with non-identity external IDs and the ``dgl.nn`` models'
weights written to a tmp dir, the models loaded through their entrypoints
(``support.dgl_models:…``), the in-process LRU cache, and the gRPC server on loopback.
Served rows must equal the model's own full-graph forward ``model(dgl_graph, x)``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.nn as dglnn  # noqa: E402
from support import assert_exact, random_edge_index  # noqa: E402
from support.dgl_models import GCN, GraphSAGE, dgl_graph  # noqa: E402
from support.servable import exact_job  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import GraphStore, make_evaluator  # noqa: E402
from hopserve.client import AsyncEmbeddingClient, EmbeddingClient  # noqa: E402
from hopserve.config import HopserveConfig  # noqa: E402
from hopserve.server.app import Service, build_server  # noqa: E402
from hopserve.testing import free_port  # noqa: E402
from hopserve.worker.runtime import make_worker  # noqa: E402
from hopserve.worker.runtime.base import _output_dim  # noqa: E402

pytestmark = pytest.mark.dgl

N, E, D_IN, D_OUT = 400, 2400, 6, 5
MODELS: dict[str, tuple[type[torch.nn.Module], dict[str, Any]]] = {
    "sage": (GraphSAGE, {"d_in": D_IN, "hidden": 16, "d_out": D_OUT, "aggregator": "mean"}),
    "gcn": (GCN, {"d_in": D_IN, "hidden": 16, "d_out": D_OUT, "norm": "both"}),
}


@dataclass
class Served:
    """A running server and what its answers must be."""

    target: str
    service: Service
    ids: np.ndarray  # external ID of the caller's node r is ids[r]
    reference: dict[str, torch.Tensor]  # model name -> full-graph forward, row r = node r
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 120) -> Any:
        """Run ``fn()`` on the server's event loop."""
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def rows(self, model: str, external: np.ndarray) -> torch.Tensor:
        """The reference rows of external IDs ``external``, in that order."""
        row_of = {int(e): r for r, e in enumerate(self.ids)}
        return self.reference[model][[row_of[int(e)] for e in external]]


def write_models(root: Path) -> tuple[np.ndarray, dict[str, torch.Tensor], list[dict]]:
    """Write the graph store and each model's weights; return the external IDs, the
    full-graph references and the model configs."""
    edge_index = random_edge_index(N, E, seed=5)  # self-loops, duplicates, isolated node
    x = torch.randn(N, D_IN, generator=torch.Generator().manual_seed(6))
    ids = 50_000 + 7 * np.random.default_rng(7).permutation(N).astype(np.int64)
    graph_dir = root / "graph"
    store = GraphStore.from_edge_index(edge_index, x, node_ids=torch.from_numpy(ids))
    store.save(graph_dir, progress=False)
    reference, configs = {}, []
    for seed, (name, (cls, kwargs)) in enumerate(MODELS.items()):
        torch.manual_seed(seed)
        model = cls(**kwargs).eval()
        weights = root / f"{name}.pt"
        torch.save(model.state_dict(), weights)
        with torch.no_grad():
            reference[name] = model(dgl_graph(edge_index, N), x)
        configs.append(
            {
                "name": name,
                "entrypoint": f"support.dgl_models:{cls.__name__}",
                "kwargs": kwargs,
                "weights": str(weights),
                "graph": str(graph_dir),
            }
        )
    return ids, reference, configs


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Both DGL models behind one front-end with the in-process worker and LRU cache."""
    ids, reference, models = write_models(tmp_path_factory.mktemp("dgl_serving"))
    config = HopserveConfig.model_validate(
        {
            "models": models,
            "server": {
                "host": "127.0.0.1",
                "port": free_port(),
                "metrics_port": 0,
                "max_wait_ms": 5,
                "grace_period_s": 1,
            },
            "cache": {"backend": "memory"},
        }
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = asyncio.run_coroutine_threadsafe(build_server(config), loop).result(60)
    out = Served(f"127.0.0.1:{service.port}", service, ids, reference, loop)
    try:
        out.call(service.start)
        ready = out.call(lambda: service.wait_ready(120))
        assert ready, [(m.name, m.state, m.error) for m in service.models]
        yield out
    finally:
        out.call(lambda: service.stop(1.0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_full_target_list_equals_full_graph_forward(served: Served, model: str) -> None:
    everything = served.ids[::-1].copy()  # every node, in an order that is neither ID nor row
    with EmbeddingClient(served.target, timeout=60.0) as client:
        got = client.get_embeddings(model, everything, cache_policy="bypass")
    assert got.shape == (N, D_OUT) and got.dtype == np.float32
    assert_exact(torch.from_numpy(got), served.rows(model, everything), f"{model} all nodes")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_partial_targets_with_duplicates(served: Served, model: str) -> None:
    """Partial lists with duplicates (incl. the isolated node), computed then from cache."""
    isolated = served.ids[N - 1]
    picks = np.random.default_rng(8).choice(served.ids, size=30, replace=True)
    ids = np.concatenate([[isolated, picks[3]], picks, [isolated, picks[3]]])
    want = served.rows(model, ids)

    async def ask(**kw: Any) -> Any:
        async with AsyncEmbeddingClient(served.target, timeout=60.0) as client:
            return await client.get_embeddings_with_info(model, ids, **kw)

    first = asyncio.run(ask(cache_policy="refresh"))  # computed, then written back
    served.call(lambda: served.service.edge.drain(10))
    again = asyncio.run(ask())
    assert len(np.unique(ids)) < len(ids) and again.cache_hits == len(ids)
    assert_exact(torch.from_numpy(first.embeddings), want, f"{model} partial")
    assert_exact(torch.from_numpy(again.embeddings), want, f"{model} partial, from cache")


# ----------------------------------------------------------------- worker, output width


@pytest.mark.parametrize("zero_ok", [True, False])
def test_worker_serves_dgl_graphconv(zero_ok: bool) -> None:
    """``Worker.add_model`` probes the output width with a DGL graph; a GraphConv that
    refuses zero in-degree nodes gets the probe's self-loops."""
    edge_index = random_edge_index(N, E, seed=9)
    loops = torch.arange(N).repeat(2, 1)  # every node has an in-edge
    edge_index = torch.cat([edge_index, loops], dim=1)
    x = torch.randn(N, D_IN, generator=torch.Generator().manual_seed(10))
    store = GraphStore.from_edge_index(edge_index, x)
    torch.manual_seed(0)
    model = GCN(D_IN, hidden=16, d_out=7, zero_ok=zero_ok).eval()
    with torch.no_grad():
        want = model(dgl_graph(edge_index, N), x)
    worker = make_worker("cpu")
    try:
        entry = worker.add_model("gcn", "1", model, store)
        assert entry.dim == 7 and entry.evaluator.mode == "layerwise"
        targets = [0, N - 1, 17, 17, 200]
        storage = store.to_storage(torch.tensor(targets)).numpy()
        job = exact_job(store, storage, num_layers=entry.num_layers, model="gcn")
        got = worker.execute(job).embeddings
    finally:
        worker.close()
    assert_exact(torch.from_numpy(got), want[targets], "worker job")


class Propagate(nn.Module):
    """K-hop propagation inside one module: refused layer-wise, served node-wise."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D_IN, 3)
        self.prop = dglnn.APPNPConv(k=2, alpha=0.1)

    def forward(self, g: dgl.DGLGraph, x: torch.Tensor) -> torch.Tensor:
        return self.prop(g, self.lin(x))


def test_output_dim_of_a_nodewise_dgl_model() -> None:
    """The node-wise fallback has no split (``split is None``): its style still counts."""
    edge_index = random_edge_index(60, 300, seed=11)
    store = GraphStore.from_edge_index(edge_index, torch.randn(60, D_IN))
    torch.manual_seed(0)
    ev = make_evaluator(Propagate().eval(), store, fallback="nodewise", hops=2)
    try:
        assert getattr(ev, "split", None) is None and ev.mode == "nodewise"
        assert _output_dim(ev) == 3
    finally:
        ev.close()
