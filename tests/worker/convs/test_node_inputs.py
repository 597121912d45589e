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
from support.models import GCNII, build
from support.sampling import check_medium_graph as check_medium_sampled
from torch import nn
from torch_geometric.nn import FAConv, GCN2Conv, PointNetConv

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


def test_a_value_read_as_x_and_as_x_0_is_computed_once_and_sliced():
    """The first conv reads ``x_0`` as ``x`` (source rows) and as ``x_0``: the adapter gets
    destination rows, the value is computed once on source rows."""
    torch.manual_seed(1)
    model = GCNII(audit.D_IN, layers=1).eval()
    edge_index = random_edge_index(50, 200, seed=2)
    x = torch.randn(50, audit.D_IN)
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=7, progress=False)
    block = ev.split.blocks[1]
    assert [(i.producer, i.rows) for i in block.inputs] == [(0, "src")], ev.split.describe()
    conv_call = next(n for n in block.module.graph.nodes if "x_0" in n.kwargs)
    sliced = conv_call.kwargs["x_0"]
    assert sliced.op == "call_function" and sliced.target.__name__ == "dst_rows"
    assert conv_call.args[0] is sliced.args[0]  # x: the same value, on source rows
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


def test_raw_features_as_x_0_and_a_shared_conv():
    """``x_0`` read from the store's features on destination rows; one conv module shared."""
    model = build("gcnii_raw_x0", audit.D_IN, seed=2)
    edge_index = random_edge_index(60, 240, seed=3)
    x = torch.randn(60, audit.D_IN, generator=torch.Generator().manual_seed(4))
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=9, progress=False)
    assert any(i.producer == -1 and i.rows == "dst" for i in ev.split.blocks[-1].inputs)
    with torch.no_grad():
        want = model(x, edge_index)
    assert_exact(ev.evaluate(), want, "raw x_0 full")
    targets = torch.tensor([59, 0, 31, 31])
    assert_exact(ev.evaluate(targets=targets), want[targets], "raw x_0 partial")


class SharedConvTwoX0(nn.Module):
    """One GCN2Conv called at two layers with a different ``x_0`` at each."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(audit.D_IN, 8), nn.Linear(audit.D_IN, 8)
        self.conv = GCN2Conv(8, alpha=0.2, theta=0.4, layer=2, shared_weights=False)

    def forward(self, x, edge_index):
        x_a, x_b = self.a(x).relu(), self.b(x).tanh()
        h = self.conv(x_a, x_a, edge_index).relu()
        return self.conv(h, x_b, edge_index)


def test_a_shared_conv_reads_each_call_s_own_x_0(medium_graph):
    torch.manual_seed(5)
    check_medium_graph(PYG, SharedConvTwoX0().eval(), medium_graph, "shared conv, two x_0")


class MeanGCN2(GCN2Conv):
    pass


class OwnMessageFA(FAConv):
    def message(self, x_j, alpha_j, alpha_i, edge_weight):
        return 2 * super().message(x_j, alpha_j, alpha_i, edge_weight)


class Wrapped(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x, edge_index):
        return self.conv(x, x, edge_index)


@pytest.mark.parametrize(
    ("conv", "match"),
    [
        (GCN2Conv(6, alpha=0.1, aggr="mean"), "aggr='mean'"),
        (FAConv(6, aggr="max"), "aggr='max'"),
        (OwnMessageFA(6), "subclass of FAConv overriding message"),
    ],
    ids=["gcn2-mean", "fa-max", "fa-subclass"],
)
def test_steps_the_adapter_would_get_wrong_are_refused(conv, match):
    """The adapters compute GCN2/FA's own sum with whole-graph degrees: another aggregation
    or a subclass's own message would be served wrong, so they are refused at load."""
    with pytest.raises(ModelTraceError, match=match):
        split_model(Wrapped(conv).eval(), 6)
    split_model(Wrapped(MeanGCN2(6, alpha=0.1)).eval(), 6)  # a subclass changing nothing
