"""A GCN trained with edge weights, served end to end over gRPC from a graph store holding
the weights: the answers equal the model's own weighted forward (and not the unweighted
one); the same model on a graph without weights is refused at load naming the parameter;
an update (or a cold-start request's delta) adding edges without their weights is refused
with INVALID_ARGUMENT (updates carrying edge data: test_edge_data_updates_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from support import assert_exact
from support.models import WeightedGCN

from hopserve import GraphStore
from hopserve.config import HopserveConfig
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc, embedding_pb2_grpc
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.testing import free_port

from .conftest import FEATURES, NUM_NODES, external_ids

KWARGS = {"d_in": FEATURES, "hidden": 16, "d_out": 5}


@pytest.fixture(scope="module")
def weighted(tmp_path_factory: pytest.TempPathFactory):
    """``(graph dir, plain graph dir, weights, edge_index, x, w)``: rows in external order."""
    gen = torch.Generator().manual_seed(21)
    ei = torch.randint(0, NUM_NODES - 3, (2, 1500), generator=gen)  # 3 isolated nodes
    ei = torch.cat([ei, ei[:, :50]], dim=1)  # parallel edges with their own weights
    x = torch.randn(NUM_NODES, FEATURES, generator=gen)
    w = torch.rand(ei.shape[1], generator=gen) * 2 + 0.05
    ids = torch.from_numpy(external_ids())
    root = tmp_path_factory.mktemp("weighted")
    GraphStore.from_edge_index(ei, x, node_ids=ids, edge_weight=w).save(root / "g", progress=False)
    GraphStore.from_edge_index(ei, x, node_ids=ids).save(root / "plain", progress=False)
    torch.manual_seed(5)
    torch.save(WeightedGCN(**KWARGS).state_dict(), root / "wgcn.pt")
    return root / "g", root / "plain", root / "wgcn.pt", ei, x, w


def _config(graph: Path, weights: Path) -> HopserveConfig:
    return HopserveConfig.model_validate({
        "models": [{
            "name": "wgcn", "version": "1", "entrypoint": "support.models:WeightedGCN",
            "kwargs": KWARGS, "weights": str(weights), "graph": str(graph),
        }],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip


def test_weighted_gcn_served_over_grpc_equals_its_weighted_forward(weighted, start_server):
    graph, _, weights, ei, x, w = weighted
    model = WeightedGCN(**KWARGS)
    model.load_state_dict(torch.load(weights, weights_only=True))
    model.eval()
    with torch.no_grad():
        want, unweighted = model(x, ei, w), model(x, ei)
    server = start_server(_config(graph, weights))
    rows = np.array([NUM_NODES - 1, 0, 17, 17, 150, NUM_NODES - 2, 42])
    ids = external_ids()[rows]
    with server.client() as client:
        for attempt in ("computed", "cached"):
            got = torch.from_numpy(client.get_embeddings("wgcn", ids).copy())
            assert_exact(got, want[rows], f"weighted GCN over gRPC ({attempt})")
            server.drain()
    # the test can fail: the weights move the rows far from the unweighted forward
    assert (got - unweighted[rows]).abs().max() > 1e-2

    with grpc.insecure_channel(server.target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                model="wgcn", add_edges=pb.EdgeList(src=[int(ids[0])], dst=[int(ids[1])]),
            ))  # fmt: skip
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "add_edges.weights" in info.value.details()
        graph_info = admin.GetGraph(admin_pb2.GetGraphRequest(model="wgcn"))
        assert graph_info.graph_seq == 0
        # a cold-start request's own edges need their weights too
        embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        delta = pb.GraphDelta(add_edges=pb.EdgeList(src=[int(ids[2])], dst=[int(ids[4])]))
        with pytest.raises(grpc.RpcError) as info:
            embed.GetEmbeddings(
                pb.GetEmbeddingsRequest(model="wgcn", node_ids=[int(ids[4])], delta=delta)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "add_edges.weights" in info.value.details()
    with server.client() as client:  # still the weighted rows
        again = torch.from_numpy(client.get_embeddings("wgcn", ids).copy())
    assert_exact(again, want[rows], "after the refused update")


def test_weighted_gcn_on_a_graph_without_weights_is_refused(weighted, start_server):
    _, plain, weights, *_ = weighted
    server = start_server(_config(plain, weights), expect_ready=False)
    (model,) = server.service.models
    assert "accepts edge data 'edge_weight'" in str(model.error)
