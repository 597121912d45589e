"""A living graph holding edge weights or features refuses updates (they carry no edge
data yet) instead of splicing its CSC without them: nothing is applied, nothing logged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hopserve.worker.graph import GraphStore
from hopserve.worker.graph.live import InvalidUpdateError, LiveGraph, MutationBatch
from hopserve.worker.graph.live.mutations import EDGE_DATA_REFUSAL, resolve
from hopserve.worker.graph.live.snapshot import GraphSnapshot, apply_batch

EDGES = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 2, 0, 1]])


@pytest.fixture
def weighted(tmp_path):
    path = tmp_path / "graph"
    x = torch.randn(5, 3)
    GraphStore.from_edge_index(
        EDGES, x, edge_weight=torch.arange(1.0, 6.0), edge_attr=torch.randn(5, 2)
    ).save(path, progress=False)
    return path


@pytest.mark.parametrize(
    "batch",
    [
        MutationBatch(add_src=[0], add_dst=[3]),
        MutationBatch(remove_src=[0], remove_dst=[1]),
        MutationBatch(add_node_ids=[9], add_node_features=np.ones((1, 3), np.float32)),
        MutationBatch(set_node_ids=[1], set_features=np.ones((1, 3), np.float32)),
    ],
    ids=["add edges", "remove edges", "add nodes", "set features"],
)
def test_updates_to_a_graph_with_edge_data_are_refused(weighted, batch):
    live = LiveGraph(weighted, with_features=True)
    before = (live.seq, live.topology.num_edges, live.topology.edge_weight.copy())
    with pytest.raises(InvalidUpdateError, match="edge weights or edge features"):
        live.apply(batch)
    topo = live.topology
    assert (live.seq, topo.num_edges) == before[:2]
    assert np.array_equal(topo.edge_weight, before[2])
    assert live.store().edge_features is not None


def test_snapshot_carries_edge_columns_and_guards_the_splice(weighted):
    snap = GraphSnapshot.of(GraphStore.open(weighted).topology)
    assert snap.has_edge_data and snap.edge_features.shape == (5, 2)
    plain = GraphSnapshot.of(GraphStore.from_edge_index(EDGES, torch.randn(5, 3)).topology)
    resolved = resolve(MutationBatch(add_src=[0], add_dst=[3]), plain, 1)
    assert apply_batch(plain, resolved).num_edges == 6  # graphs without edge data: as before
    with pytest.raises(InvalidUpdateError) as err:
        apply_batch(snap, resolved)
    assert str(err.value) == EDGE_DATA_REFUSAL
