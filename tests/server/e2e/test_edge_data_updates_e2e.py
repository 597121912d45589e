"""UpdateGraph and cold-start deltas carrying edge data, end to end over gRPC.

A real server with a weighted GCN (``edge_weight``) and a GAT/GATv2 with ``edge_dim``
(``edge_attr``) on one graph holding both edge columns, and GraphSAGE on a graph without
edge columns. Updates sent with the client SDK (weights and feature rows of the added
edges, removals of edges that carry data, a parallel edge, a self-loop), a compaction
and a request-scoped delta with edge data: every served row equals the models' own
forward on an edge list kept by the test. Each bad input is INVALID_ARGUMENT naming the
field, and nothing is applied.
"""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest
import torch
from support import assert_exact
from support.edge_models import EdgeFeatureNet
from support.models import GraphSAGE, WeightedGCN

from hopserve import GraphStore
from hopserve.client import AdminClient, EmbeddingClient, InvalidArgumentError
from hopserve.config import HopserveConfig
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc, embedding_pb2_grpc
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.testing import free_port

from .conftest import FEATURES, NUM_NODES, external_ids

D_E = 3
MODELS = {
    "wgcn": ("support.models:WeightedGCN", {"d_in": FEATURES, "hidden": 16, "d_out": 5}),
    "gat": ("support.edge_models:EdgeFeatureNet", {"d_in": FEATURES, "d_edge": D_E}),
    "sage": ("support.models:GraphSAGE", {"d_in": FEATURES, "hidden": 16, "d_out": 5}),
}
CLASSES = {"wgcn": WeightedGCN, "gat": EdgeFeatureNet, "sage": GraphSAGE}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(7)
    return CLASSES[name](**MODELS[name][1]).eval()


class Oracle:
    """The edge graph as plain lists by external ID: features, and edges with their data
    (removals drop every copy of a pair, added edges are appended)."""

    def __init__(self, path) -> None:
        store = GraphStore.open(path)
        ext = store.to_external(torch.arange(store.num_nodes)).numpy()
        self.ids = [int(v) for v in ext]
        self.features = {int(v): store.features[k].numpy().copy() for k, v in enumerate(ext)}
        ei = store.edge_index().numpy()
        w, f = store.edge_weight.numpy(), store.edge_features.numpy()
        self.edges = [
            (int(ext[s]), int(ext[d]), float(w[k]), f[k].copy())
            for k, (s, d) in enumerate(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
        ]

    def update(self, add_nodes=None, add_edges=(), weights=(), feats=(), remove=()) -> None:
        for v, row in zip(*(add_nodes or ((), ())), strict=True):
            self.ids.append(int(v))
            self.features[int(v)] = np.asarray(row, np.float32)
        gone = {(int(s), int(d)) for s, d in zip(*remove, strict=True)} if remove else set()
        self.edges = [e for e in self.edges if (e[0], e[1]) not in gone]
        if add_edges:
            for (s, d), w, f in zip(zip(*add_edges, strict=True), weights, feats, strict=True):
                self.edges.append((int(s), int(d), float(w), np.asarray(f, np.float32)))

    def forward(self, name: str, ids, edges=None) -> torch.Tensor:
        edges = self.edges if edges is None else edges
        row = {v: i for i, v in enumerate(self.ids)}
        x = torch.from_numpy(np.stack([self.features[v] for v in self.ids]))
        ei = torch.tensor([[row[e[0]] for e in edges], [row[e[1]] for e in edges]])
        if name == "wgcn":
            data = torch.tensor([e[2] for e in edges], dtype=torch.float32)
        else:
            data = torch.from_numpy(np.stack([e[3] for e in edges]))
        with torch.no_grad():
            out = _model(name)(x, ei, data)
        return out[[row[int(v)] for v in ids]]


@pytest.fixture
def served(tmp_path, graph_dir, start_server):
    """``(server, edge graph folder, plain graph folder)``."""
    gen = torch.Generator().manual_seed(31)
    ei = torch.randint(0, NUM_NODES, (2, 1200), generator=gen)
    ei = torch.cat([ei, ei[:, :40], torch.arange(5).repeat(2, 1)], dim=1)  # parallel, loops
    e = ei.shape[1]
    edges = tmp_path / "edges"
    GraphStore.from_edge_index(
        ei, torch.randn(NUM_NODES, FEATURES, generator=gen),
        node_ids=torch.from_numpy(external_ids()),
        edge_weight=torch.rand(e, generator=gen) + 0.1,
        edge_attr=torch.randn(e, D_E, generator=gen),
    ).save(edges, progress=False)  # fmt: skip
    plain = tmp_path / "plain"
    shutil.copytree(graph_dir, plain, ignore=shutil.ignore_patterns("updates"))
    models = []
    for name, (entrypoint, kwargs) in MODELS.items():
        torch.save(_model(name).state_dict(), tmp_path / f"{name}.pt")
        models.append({
            "name": name, "version": "1", "entrypoint": entrypoint, "kwargs": kwargs,
            "weights": str(tmp_path / f"{name}.pt"),
            "graph": str(plain if name == "sage" else edges),
        })  # fmt: skip
    config = HopserveConfig.model_validate({
        "models": models,
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    return start_server(config), edges, plain


def _exact(server, oracle: Oracle, ids, what: str) -> None:
    with server.client() as client:
        for name in ("wgcn", "gat"):
            for attempt in ("computed", "cached"):
                got = torch.from_numpy(client.get_embeddings(name, ids).copy())
                assert_exact(got, oracle.forward(name, ids), f"{name} {what} ({attempt})")
                server.drain()


def test_updates_with_edge_data_are_served_exactly(served):
    server, edges, _ = served
    oracle = Oracle(edges)
    ids = external_ids()
    rng = np.random.default_rng(4)
    targets = np.concatenate([ids[[0, 1, 2, 3, 4]], rng.choice(ids, 10)])
    _exact(server, oracle, targets, "before")
    with AdminClient(server.target, timeout=30) as admin:
        for step in range(3):
            new = 90_000 + 10 * step + np.arange(2)
            feats = rng.standard_normal((2, FEATURES)).astype(np.float32)
            e = oracle.edges
            remove = ([e[7 + step][0], e[40][0]], [e[7 + step][1], e[40][1]])  # data goes too
            src = [new[0], ids[3], e[0][0], ids[4], new[1]]
            dst = [ids[3], new[1], e[0][1], ids[4], new[0]]  # a parallel edge, a self-loop
            w = rng.uniform(0.2, 3, len(src)).astype(np.float32)
            f = rng.standard_normal((len(src), D_E)).astype(np.float32)
            done = admin.update_graph(
                "wgcn", add_nodes=(new, feats), add_edges=(src, dst), remove_edges=remove,
                edge_weights=w, edge_features=f, idempotency_key=f"edge-data-{step}",
            )  # fmt: skip
            assert done.graph_seq == step + 1 and done.edges_added == len(src)
            oracle.update((new, feats), (src, dst), w, f, remove)
            targets = np.concatenate([targets, new])
            _exact(server, oracle, targets, f"after update {step + 1}")
        assert admin.compact_graph("gat").base_seq == 3
    _exact(server, oracle, targets, "after the compaction")

    # a cold-start delta with its edges' data: exact for graph + delta, nothing stored
    w, f = np.float32([0.7, 1.9]), rng.standard_normal((2, D_E)).astype(np.float32)
    delta = pb.GraphDelta(
        add_nodes=pb.NodeRows(node_ids=[77_777], dim=FEATURES, dtype=pb.DTYPE_FLOAT32,
                              features=np.ones((1, FEATURES), "<f4").tobytes()),
        add_edges=pb.EdgeList(src=[int(ids[5]), 77_777], dst=[77_777, int(ids[6])],
                              weights=w.tobytes(), features=f.tobytes(), feature_dim=D_E,
                              dtype=pb.DTYPE_FLOAT32),
    )  # fmt: skip
    with_delta = Oracle.__new__(Oracle)
    with_delta.ids, with_delta.features = [*oracle.ids, 77_777], dict(oracle.features)
    with_delta.features[77_777] = np.ones(FEATURES, np.float32)
    with_delta.edges = [
        *oracle.edges,
        (int(ids[5]), 77_777, float(w[0]), f[0]),
        (77_777, int(ids[6]), float(w[1]), f[1]),
    ]
    asked = [77_777, int(ids[6]), int(ids[5])]
    with grpc.insecure_channel(server.target) as channel:
        embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        for name in ("wgcn", "gat"):
            reply = embed.GetEmbeddings(
                pb.GetEmbeddingsRequest(model=name, node_ids=asked, delta=delta)
            )
            got = np.frombuffer(reply.embeddings, "<f4").reshape(len(asked), -1)
            assert_exact(torch.from_numpy(got.copy()), with_delta.forward(name, asked), name)
    with EmbeddingClient(server.target, timeout=30) as client:  # the same delta, SDK-built
        for name in ("wgcn", "gat"):
            got = client.get_embeddings_with_info(
                name, asked, add_nodes=([77_777], np.ones((1, FEATURES), np.float32)),
                add_edges=([int(ids[5]), 77_777], [77_777, int(ids[6])]),
                edge_weights=w, edge_features=f,
            ).embeddings  # fmt: skip
            assert_exact(torch.from_numpy(got), with_delta.forward(name, asked), f"{name} SDK")
        with pytest.raises(InvalidArgumentError, match="need add_edges"):
            client.get_embeddings_with_info("wgcn", asked, edge_weights=w)
    _exact(server, oracle, targets, "after the delta (nothing stored)")


def _edges(src, dst, w=None, f=None, dim=None, dtype=pb.DTYPE_FLOAT32) -> pb.EdgeList:
    out = pb.EdgeList(src=[int(v) for v in src], dst=[int(v) for v in dst])
    if w is not None:
        out.weights = np.asarray(w, "<f4").tobytes()
    if f is not None:
        f = np.asarray(f, "<f4")
        out.features, out.feature_dim = f.tobytes(), f.shape[1] if dim is None else dim
    if w is not None or f is not None:
        out.dtype = dtype
    return out


IDS = external_ids()
SRC, DST = IDS[[0, 1, 2]], IDS[[3, 3, 4]]
W3, F3 = [1.0, 2.0, 0.5], np.ones((3, D_E))
BAD = {
    "no weights": ("wgcn", {"add_edges": _edges(SRC, DST, f=F3)},
                   "add_edges.weights: the graph holds an edge weight per edge, but the 3 added"),
    "no features": ("gat", {"add_edges": _edges(SRC, DST, w=W3)},
                    "add_edges.features: the graph holds 3 edge features per edge, but the 3"),
    "feature width": ("gat", {"add_edges": _edges(SRC, DST, W3, np.ones((3, 2)))},
                      "width 2 given, the graph's edge feature width is 3"),
    "NaN weight": ("wgcn", {"add_edges": _edges(SRC, DST, [1.0, 1.0, np.nan], F3)},
                   "add_edges.weights[2]: the weight of edge 2 is NaN or Inf"),
    "inf features": ("gat", {"add_edges": _edges(SRC, DST, W3, [[0, 0, 0], [0, np.inf, 0], [0] * 3])},
                     "add_edges.features[1]: the features of edge 1 hold NaN or Inf"),
    "weight count": ("wgcn", {"add_edges": _edges(SRC, DST, [1.0, 2.0], F3)},
                     "add_edges.weights: 8 bytes for 3 edges"),
    "removal with data": ("wgcn", {"remove_edges": _edges(SRC[:1], DST[:1], [1.0])},
                          "remove_edges: edge data (weights / features) is only taken for added"),
    "no dtype": ("wgcn", {"add_edges": _edges(SRC, DST, W3, F3, dtype=pb.DTYPE_UNSPECIFIED)},
                 "add_edges: dtype must be DTYPE_FLOAT32"),
    "weights, no column": ("sage", {"add_edges": _edges(SRC, DST, W3)},
                           "add_edges.weights: the graph holds no edge weights, but 3 were given"),
    "features, no column": ("sage", {"add_edges": _edges(SRC, DST, f=F3)},
                            "add_edges.features: the graph holds no edge features, but 3 row(s)"),
}  # fmt: skip


def test_bad_edge_data_is_invalid_argument_and_nothing_is_applied(served):
    server, edges, _ = served
    oracle = Oracle(edges)
    targets = IDS[[0, 3, 4, 5]]
    new = pb.NodeRows(node_ids=[88_888], dim=FEATURES, dtype=pb.DTYPE_FLOAT32,
                      features=np.ones((1, FEATURES), "<f4").tobytes())  # fmt: skip
    with grpc.insecure_channel(server.target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        before = {m: admin.GetGraph(admin_pb2.GetGraphRequest(model=m)) for m in ("wgcn", "sage")}
        for what, (model, fields, message) in BAD.items():
            with pytest.raises(grpc.RpcError) as info:
                admin.UpdateGraph(
                    admin_pb2.UpdateGraphRequest(model=model, add_nodes=new, **fields)
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
            assert message in info.value.details(), (what, info.value.details())
            after = admin.GetGraph(admin_pb2.GetGraphRequest(model=model))
            plain = "sage" if model == "sage" else "wgcn"
            assert after == before[plain], f"{what}: something was applied"
        # a delta without its edges' weights is refused the same way
        delta = pb.GraphDelta(add_edges=_edges(SRC[:1], DST[:1], f=F3[:1]))
        with pytest.raises(grpc.RpcError) as info:
            embed.GetEmbeddings(pb.GetEmbeddingsRequest(model="wgcn", node_ids=[int(IDS[3])],
                                                        delta=delta))  # fmt: skip
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "delta: add_edges.weights" in info.value.details()
        # an old-style update (no edge data) still works on the graph without columns
        done = admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
            model="sage", add_edges=_edges(SRC, DST), idempotency_key="plain"))  # fmt: skip
        assert done.graph_seq == 1 and done.edges_added == 3
    _exact(server, oracle, targets, "after the refused batches")
    with AdminClient(server.target, timeout=30) as admin:  # the SDK checks before sending
        with pytest.raises(InvalidArgumentError, match="edge_weights: shape"):
            admin.update_graph("wgcn", add_edges=(SRC, DST), edge_weights=[1.0])
        with pytest.raises(InvalidArgumentError, match="not finite"):
            admin.update_graph("wgcn", add_edges=(SRC, DST), edge_weights=[1, np.nan, 1])
        with pytest.raises(InvalidArgumentError, match="need add_edges"):
            admin.update_graph("wgcn", remove_edges=(SRC, DST), edge_weights=W3)
