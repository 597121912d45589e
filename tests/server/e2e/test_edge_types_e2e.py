"""A model over typed edges (``RGCNConv`` with ``edge_type``) served end to end over gRPC.

A real server serves an RGCN on a graph whose edges carry relation names. Updates sent
with the client SDK name each added edge's relation (a parallel edge under another
relation, a removal that drops a pair under every relation), ``GetGraph`` lists the
relations, a compaction keeps them, and a request-scoped delta names its edges'
relations: every served row equals the model's own forward on an edge list kept by the
test. Missing or unknown relations are INVALID_ARGUMENT naming the field, with nothing
applied.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from support import assert_exact
from support.edge_models import RelationalGCN

from hopserve import GraphStore
from hopserve.client import AdminClient, EmbeddingClient, InvalidArgumentError
from hopserve.config import HopserveConfig
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc
from hopserve.testing import free_port

from .conftest import FEATURES, NUM_NODES, external_ids

NAMES = ["belongs-to", "buys", "clicks"]
KWARGS = {"d_in": FEATURES, "relations": len(NAMES)}


def _model() -> torch.nn.Module:
    torch.manual_seed(7)
    return RelationalGCN(**KWARGS).eval()


class Oracle:
    """The typed graph as plain lists by external ID (removals drop every relation of a
    pair; added edges are appended)."""

    def __init__(self, path) -> None:
        store = GraphStore.open(path)
        ext = store.to_external(torch.arange(store.num_nodes)).numpy()
        self.ids = [int(v) for v in ext]
        self.features = {int(v): store.features[k].numpy().copy() for k, v in enumerate(ext)}
        ei, et = store.edge_index().numpy(), store.edge_type.numpy()
        self.edges = [
            (int(ext[s]), int(ext[d]), store.relations[et[k]])
            for k, (s, d) in enumerate(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
        ]

    def update(self, add_edges=(), relations=(), remove=(), add_nodes=None) -> None:
        for v, row in zip(*(add_nodes or ((), ())), strict=True):
            self.ids.append(int(v))
            self.features[int(v)] = np.asarray(row, np.float32)
        gone = {(int(s), int(d)) for s, d in zip(*remove, strict=True)} if remove else set()
        self.edges = [e for e in self.edges if (e[0], e[1]) not in gone]
        for (s, d), r in zip(zip(*add_edges, strict=True), relations, strict=True):
            self.edges.append((int(s), int(d), r))

    def forward(self, ids) -> torch.Tensor:
        row = {v: i for i, v in enumerate(self.ids)}
        x = torch.from_numpy(np.stack([self.features[v] for v in self.ids]))
        ei = torch.tensor([[row[s] for s, _, _ in self.edges], [row[d] for _, d, _ in self.edges]])
        et = torch.tensor([NAMES.index(r) for _, _, r in self.edges])
        with torch.no_grad():
            return _model()(x, ei, et)[[row[int(v)] for v in ids]]


@pytest.fixture
def served(tmp_path, start_server):
    gen = torch.Generator().manual_seed(41)
    ei = torch.randint(0, NUM_NODES, (2, 1200), generator=gen)
    ei = torch.cat([ei, ei[:, :40]], dim=1)  # the same pairs again, other relations
    names = np.array(NAMES)[torch.randint(0, 3, (ei.shape[1],), generator=gen).numpy()]
    path = tmp_path / "typed"
    GraphStore.from_edge_index(
        ei, torch.randn(NUM_NODES, FEATURES, generator=gen),
        node_ids=torch.from_numpy(external_ids()), edge_type=names,
    ).save(path, progress=False)  # fmt: skip
    torch.save(_model().state_dict(), tmp_path / "rgcn.pt")
    config = HopserveConfig.model_validate({
        "models": [{
            "name": "rgcn", "version": "1", "entrypoint": "support.edge_models:RelationalGCN",
            "kwargs": KWARGS, "weights": str(tmp_path / "rgcn.pt"), "graph": str(path),
        }],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    return start_server(config), path


def _exact(server, oracle: Oracle, ids, what: str) -> None:
    with server.client() as client:
        for attempt in ("computed", "cached"):
            got = torch.from_numpy(client.get_embeddings("rgcn", ids).copy())
            assert_exact(got, oracle.forward(ids), f"rgcn {what} ({attempt})")
            server.drain()


def test_typed_updates_and_deltas_are_served_exactly(served):
    server, path = served
    oracle = Oracle(path)
    ids = external_ids()
    rng = np.random.default_rng(5)
    targets = np.concatenate([ids[[0, 1, 2, 3]], rng.choice(ids, 10)])
    _exact(server, oracle, targets, "before")
    with AdminClient(server.target, timeout=30) as admin:
        assert admin.get_graph("rgcn").relations == NAMES
        for step in range(2):
            new = [95_000 + step]
            feats = rng.standard_normal((1, FEATURES)).astype(np.float32)
            e = oracle.edges
            remove = ([e[3 + step][0]], [e[3 + step][1]])  # every relation of the pair
            src = [new[0], ids[3], e[0][0], ids[3]]
            dst = [ids[3], new[0], e[0][1], new[0]]  # a pair again under another relation
            rel = ["clicks", "buys", next(r for r in NAMES if r != e[0][2]), "belongs-to"]
            done = admin.update_graph(
                "rgcn", add_nodes=(new, feats), add_edges=(src, dst), remove_edges=remove,
                edge_relations=rel, idempotency_key=f"typed-{step}",
            )  # fmt: skip
            assert done.edges_added == len(src)
            oracle.update((src, dst), rel, remove, (new, feats))
            targets = np.concatenate([targets, new])
            _exact(server, oracle, targets, f"after update {step + 1}")
        info = admin.compact_graph("rgcn")
        assert info.base_seq == 2 and info.relations == NAMES
    _exact(server, oracle, targets, "after the compaction")

    # a cold-start delta naming its edges' relations: exact for graph + delta
    delta_edges = ([int(ids[5]), 77_777], [77_777, int(ids[6])])
    with_delta = Oracle.__new__(Oracle)
    with_delta.ids, with_delta.features = [*oracle.ids, 77_777], dict(oracle.features)
    with_delta.features[77_777] = np.ones(FEATURES, np.float32)
    with_delta.edges = [
        *oracle.edges,
        (int(ids[5]), 77_777, "buys"),
        (77_777, int(ids[6]), "clicks"),
    ]
    asked = [77_777, int(ids[6]), int(ids[5])]
    with EmbeddingClient(server.target, timeout=30) as client:
        got = client.get_embeddings_with_info(
            "rgcn", asked, add_nodes=([77_777], np.ones((1, FEATURES), np.float32)),
            add_edges=delta_edges, edge_relations=["buys", "clicks"],
        ).embeddings  # fmt: skip
        assert_exact(torch.from_numpy(got), with_delta.forward(asked), "rgcn delta")
        with pytest.raises(InvalidArgumentError, match="name no relation"):
            client.get_embeddings_with_info("rgcn", asked[1:], add_edges=delta_edges)
        with pytest.raises(InvalidArgumentError, match="need add_edges"):
            client.get_embeddings_with_info("rgcn", asked[1:], edge_relations=["buys"])
    _exact(server, oracle, targets, "after the delta (nothing stored)")


@pytest.mark.parametrize(
    ("relations", "message"),
    [
        (None, "add_edges.relations: the graph's edges are typed (belongs-to, buys, clicks), "
               "but the 2 added edge(s) name no relation"),
        (["buys", "likes"], "add_edges.relations: unknown relation 'likes'; the relations are"),
    ],
    ids=["missing", "unknown"],
)  # fmt: skip
def test_bad_relations_are_invalid_argument_and_nothing_is_applied(served, relations, message):
    server, _ = served
    ids = external_ids()
    with AdminClient(server.target, timeout=30) as admin:
        before = admin.get_graph("rgcn")
        with pytest.raises(InvalidArgumentError, match="relation") as info:
            admin.update_graph("rgcn", add_edges=(ids[:2], ids[2:4]), edge_relations=relations)
        assert message in str(info.value)
        assert admin.get_graph("rgcn") == before
    with grpc.insecure_channel(server.target) as channel:  # a count mismatch, raw proto
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        request = admin_pb2.UpdateGraphRequest(model="rgcn")
        request.add_edges.src.extend(ids[:2].tolist())
        request.add_edges.dst.extend(ids[2:4].tolist())
        request.add_edges.relations.append("buys")
        with pytest.raises(grpc.RpcError) as err:
            stub.UpdateGraph(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "add_edges.relations: 1 names for 2 edges" in err.value.details()
