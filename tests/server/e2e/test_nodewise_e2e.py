"""A model that reads out-neighbours (``DirGNNConv``), served by the node-wise fallback
end to end over gRPC on a living graph.

A real server with the final-row cache serves a two-layer ``DirGNNConv(GCNConv)`` model
(``fallback: nodewise``, receptive field both ways). Every row, computed and then
cached, equals the model's own forward on an edge list kept by the test, before and
after updates that add and remove edges and set features: a change invalidates the rows
upstream of it too (their out-neighbours changed), not only those downstream.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_exact
from support.models import DirGCN

from hopserve import GraphStore
from hopserve.client import AdminClient
from hopserve.config import HopserveConfig
from hopserve.testing import free_port

FEATURES, NUM_NODES = 6, 120
KWARGS = {"d_in": FEATURES, "hidden": 8, "d_out": 4}


def _model() -> torch.nn.Module:
    torch.manual_seed(5)
    return DirGCN(**KWARGS).eval()


@pytest.fixture
def served(tmp_path, start_server):
    """``(server, ids, features, edges)``: a sparse directed graph (about 2 edges a node,
    so a change reaches a fraction of the rows) and the server serving the model on it."""
    gen = torch.Generator().manual_seed(3)
    edge_index = torch.randint(0, NUM_NODES, (2, 2 * NUM_NODES), generator=gen)
    x = torch.randn(NUM_NODES, FEATURES, generator=gen)
    ids = 500 + 3 * np.arange(NUM_NODES)
    GraphStore.from_edge_index(edge_index, x, node_ids=torch.from_numpy(ids)).save(
        tmp_path / "g", progress=False
    )
    torch.save(_model().state_dict(), tmp_path / "dir.pt")
    config = HopserveConfig.model_validate({
        "models": [{"name": "dir", "entrypoint": "support.models:DirGCN", "kwargs": KWARGS,
                    "weights": str(tmp_path / "dir.pt"), "graph": str(tmp_path / "g"),
                    "fallback": "nodewise"}],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    edges = [(int(ids[s]), int(ids[d])) for s, d in edge_index.t().tolist()]
    features = {int(v): x[i].numpy().copy() for i, v in enumerate(ids)}
    return start_server(config), ids, features, edges


def _forward(ids, features: dict, edges: list, asked) -> torch.Tensor:
    row = {int(v): i for i, v in enumerate(ids)}
    x = torch.from_numpy(np.stack([features[int(v)] for v in ids]))
    ei = torch.tensor([[row[s] for s, _ in edges], [row[d] for _, d in edges]])
    with torch.no_grad():
        return _model()(x, ei)[[row[int(v)] for v in asked]]


def _exact(server, ids, features, edges, what: str) -> None:
    want = _forward(ids, features, edges, ids)
    with server.client() as client:
        for attempt in ("computed or cached", "cached"):
            got = torch.from_numpy(client.get_embeddings("dir", ids).copy())
            assert_exact(got, want, f"{what} ({attempt})")
            server.drain()


def test_a_model_reading_out_edges_is_served_exactly_through_updates(served):
    server, ids, features, edges = served
    with server.client() as client:
        info = client.get_model("dir")
    assert "in- and out-edges" in info.description
    _exact(server, ids, features, edges, "before")
    rng = np.random.default_rng(8)
    with AdminClient(server.target, timeout=30) as admin:
        for step in range(4):
            src, dst = rng.choice(ids, 2), rng.choice(ids, 2)
            gone = edges[int(rng.integers(len(edges)))]
            node = int(rng.choice(ids))
            row = rng.standard_normal((1, FEATURES)).astype(np.float32)
            admin.update_graph(
                "dir", add_edges=(src, dst), remove_edges=([gone[0]], [gone[1]]),
                set_features=([node], row), idempotency_key=f"dir-{step}",
            )  # fmt: skip
            edges = [e for e in edges if e != gone]
            edges += [(int(s), int(d)) for s, d in zip(src, dst, strict=True)]
            features[node] = row[0]
            _exact(server, ids, features, edges, f"after update {step + 1}")
