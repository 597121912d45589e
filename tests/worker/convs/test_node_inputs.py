"""Convs with a second per-node input (``ConvAdapter.node_inputs``): the initial-residual
convs (``GCN2Conv``, ``FAConv``: ``x_0`` on destination rows, whole-graph normalization)
and the point-cloud convs (positions and normals on source rows). Each equals the model's
own forward in many batches, on random graphs and sampled; the split reads ``x_0`` on
destination rows only; calls the engine cannot serve are refused naming the argument.
"""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_edge_index
from support import conv_audit as audit
from support.exactness import PYG, check_medium_graph, check_random_graph, family_cases, graphs
from support.models import GCNII
from support.sampling import check_medium_graph as check_medium_sampled
from torch import nn
from torch_geometric.nn import GCN2Conv, PointNetConv

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.trace import ModelTraceError, split_model

CASES = {
    "GCN2Conv": ("GCN2Conv", 0),
    "GCN2Conv-two-weights": ("GCN2Conv", 1),
    "FAConv": ("FAConv", 0),
    "PointNetConv": ("PointNetConv", 0),
    "PPFConv": ("PPFConv", 0),
    "PointTransformerConv": ("PointTransformerConv", 0),
    "PointGNNConv": ("PointGNNConv", 0),
}


def model_of(key: str, seed: int = 3) -> nn.Module:
    name, index = CASES[key]
    return audit.build_model("pyg", audit.pyg_classes()[name], audit.PYG_CASES[name][index], seed)


@pytest.mark.parametrize("key", sorted(CASES))
def test_medium_graph_many_batches(key, medium_graph):
    check_medium_graph(PYG, model_of(key), medium_graph, key)


@pytest.mark.parametrize("key", ["GCN2Conv", "FAConv", "PointNetConv"])
def test_medium_graph_sampled(key, medium_graph):
    """Sampled: GCN2/FA normalize by the sampled graph's degrees, as their forward on it."""
    check_medium_sampled(PYG, model_of(key), medium_graph, [([3, 2], 7), ([-1, 1], 0)], key)


@family_cases(["gcn2", "fa"], 25, graphs())
def test_deep_initial_residual_random_graphs(family, case):
    """Four convs reading one ``x_0`` (isolated nodes, self-loops, duplicate edges)."""
    torch.manual_seed(0)
    check_random_graph(
        PYG, GCNII(audit.D_IN, layers=4, conv=family).eval(), case, f"GCNII {family}"
    )


@pytest.mark.parametrize("conv", ["gcn2", "fa"])
def test_x_0_is_read_on_destination_rows_only(conv):
    """Later layers gather only their destinations' rows of ``x_0``, not every source's."""
    split = split_model(GCNII(audit.D_IN, conv=conv).eval(), audit.D_IN)
    for block in split.blocks[2:]:
        reads = {i.name: i.rows for i in block.inputs if i.producer == 0}
        assert reads and set(reads.values()) == {"dst"}, split.describe()


def test_x_0_also_the_feature_input_is_sliced_for_the_conv():
    """The first conv reads ``x_0`` as ``x`` (source rows) and as ``x_0``: the adapter gets
    destination rows, the value is computed once on source rows."""
    torch.manual_seed(1)
    model = GCNII(audit.D_IN, layers=1).eval()
    edge_index = random_edge_index(50, 200, seed=2)
    x = torch.randn(50, audit.D_IN)
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=7, progress=False)
    with torch.no_grad():
        want = model(x, edge_index)
    assert_exact(ev.evaluate(), want, "GCNII x1 full")
    assert_exact(ev.evaluate(targets=torch.tensor([3, 49])), want[[3, 49]], "partial")


def test_weighted_gcn2_refuses_a_graph_without_weights():
    """A GCN2 model passing edge_weight refuses a store without the column, naming it."""
    case = audit.PYG_CASES["GCN2Conv"][2]
    model = audit.build_model("pyg", GCN2Conv, case)
    store = GraphStore.from_edge_index(random_edge_index(20, 40, seed=1), torch.randn(20, 6))
    with pytest.raises(ModelTraceError, match="edge_weight"):
        LayerwiseEvaluator(model, store, progress=False)


class ConstantX0(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = GCN2Conv(6, alpha=0.1)
        self.register_buffer("x_0", torch.zeros(1, 6))

    def forward(self, x, edge_index):
        return self.conv(x, self.x_0, edge_index)


class PositionsArgument(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = PointNetConv(local_nn=nn.Linear(9, 4))

    def forward(self, x, edge_index, pos):
        return self.conv(x, pos, edge_index)


class NodeTensorAsEdgeWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = GCN2Conv(6, alpha=0.1)

    def forward(self, x, edge_index):
        return self.conv(x, x, edge_index, x.sum(-1))  # a per-node tensor as edge_weight


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (ConstantX0(), "'x_0'.*one row per node"),
        (PositionsArgument(), "required extra argument 'pos'"),
        (NodeTensorAsEdgeWeight(), "argument 'edge_weight'.*per-node 'x_0'"),
    ],
    ids=["constant-x_0", "pos-from-forward", "node-tensor-as-edge-weight"],
)
def test_refusals_name_the_argument(model, match):
    with pytest.raises(ModelTraceError, match=match):
        split_model(model.eval(), 6)


@pytest.mark.parametrize("key", ["PointNetConv", "PointGNNConv"])
def test_positions_come_from_the_features(key):
    """Changing the features' position columns changes the served rows as the forward's."""
    model = model_of(key)
    edge_index = random_edge_index(30, 90, seed=4)
    x = torch.randn(30, audit.D_IN, generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, :3] += torch.tensor([0.5, -1.0, 2.0])  # a shifted cloud: pos_j - pos_i unchanged
    x2[7, :3] += 3.0  # but node 7 moves
    for feats in (x, x2):
        store = GraphStore.from_edge_index(edge_index, feats)
        ev = LayerwiseEvaluator(model, store, init_batch_nodes=5, progress=False)
        with torch.no_grad():
            assert_exact(ev.evaluate(), model(feats, edge_index), f"{key}")


class RawFeaturesAsX0(nn.Module):
    """``x_0`` is the model's feature input itself (read on destination rows from the
    store), and one GCN2Conv module is shared by both layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = GCN2Conv(audit.D_IN, alpha=0.3, theta=0.5, layer=1)

    def forward(self, x, edge_index):
        h = self.conv(x, x, edge_index).relu()
        return self.conv(h, x, edge_index)


def test_raw_features_as_x_0_and_a_shared_conv():
    torch.manual_seed(2)
    model = RawFeaturesAsX0().eval()
    edge_index = random_edge_index(60, 240, seed=3)
    x = torch.randn(60, audit.D_IN, generator=torch.Generator().manual_seed(4))
    ev = LayerwiseEvaluator(
        model, GraphStore.from_edge_index(edge_index, x), init_batch_nodes=9, progress=False
    )
    assert any(i.producer == -1 and i.rows == "dst" for i in ev.split.blocks[-1].inputs)
    with torch.no_grad():
        want = model(x, edge_index)
    assert_exact(ev.evaluate(), want, "raw x_0 full")
    targets = torch.tensor([59, 0, 31, 31])
    assert_exact(ev.evaluate(targets=targets), want[targets], "raw x_0 partial")
