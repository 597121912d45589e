"""Models the engine cannot split are refused at load, naming the module or line."""

from __future__ import annotations

import pytest
import torch
from support import random_edge_index
from support.models import LinAPPNP, OneConv
from torch import nn
from torch_geometric.nn import MessagePassing, SAGEConv, SGConv
from torch_geometric.utils import add_self_loops

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.trace import ModelTraceError, trace_model


@pytest.fixture(scope="module")
def store():
    n = 60
    return GraphStore.from_edge_index(random_edge_index(n, 300), torch.randn(n, 4))


class WithAPPNP(LinAPPNP):
    def __init__(self):
        super().__init__(nn.Linear(4, 3), k=3)


class GraphOutsideConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(4, 3)

    def forward(self, x, edge_index):
        edge_index, _ = add_self_loops(edge_index)
        return self.conv(x, edge_index)


class EdgeIndexArithmetic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(4, 3)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index.flip(0))


class GraphPooling(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(4, 3)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index) - x.mean(dim=0)[:3]


class SoftmaxOverNodes(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(4, 3)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index).softmax(dim=0)


class DataDependentBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(4, 3)

    def forward(self, x, edge_index):
        if x.sum() > 0:
            return self.conv(x, edge_index)
        return x[:, :3]


class NoConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, edge_index):
        return self.lin(x)


class MyConv(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.lin = nn.Linear(4, 3)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))


class UsesMyConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = MyConv()

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


@pytest.mark.parametrize(
    ("model_cls", "fragment"),
    [
        (WithAPPNP, "conv 'prop' (APPNP)"),
        (GraphOutsideConv, "test_tracer.py:"),
        (EdgeIndexArithmetic, "used outside a conv by 'flip'"),
        (GraphPooling, "'mean' at"),
        (SoftmaxOverNodes, "differs from the model's own forward"),
        (DataDependentBranch, "test_tracer.py:"),
        (NoConv, "has no graph conv"),
        (UsesMyConv, "not in hopserve's support matrix"),
    ],
)
def test_refused_with_location(store, model_cls, fragment):
    with pytest.raises(ModelTraceError) as info:
        LayerwiseEvaluator(model_cls(), store)
    assert fragment in str(info.value)


def test_refusal_names_source_line_of_the_model(store):
    with pytest.raises(ModelTraceError) as info:
        LayerwiseEvaluator(EdgeIndexArithmetic(), store)
    assert "edge_index.flip(0)" in str(info.value)


def test_sgconv_refused_as_multi_hop(store):
    with pytest.raises(ModelTraceError, match="K hops"):
        LayerwiseEvaluator(OneConv(SGConv(4, 3, K=2)), store)


def test_trace_records_style_and_convs():
    traced = trace_model(UsesMyConv())
    assert traced.style == "pyg"
    assert traced.feature_arg == "x" and traced.graph_arg == "edge_index"
    assert [str(n.target) for n in traced.conv_nodes] == ["conv"]


def test_required_extra_argument_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = SAGEConv(4, 3)

        def forward(self, x, edge_index, batch):
            return self.conv(x, edge_index)

    with pytest.raises(ModelTraceError, match="required extra argument 'batch'"):
        trace_model(Net())


@pytest.mark.parametrize("name", ["edge_weight", "edge_attr", "edge_feats", "e_feat", "edge_norm"])
def test_optional_edge_data_argument_refused_naming_it(name, store):
    """A GCN trained with edge weights must not be served silently without them: refused
    at load on a graph without the column (edge norms at trace: never served)."""
    from torch_geometric.nn import GATConv, GCNConv

    weight = name in ("edge_weight", "edge_norm")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(4, 3) if weight else GATConv(4, 3, edge_dim=2)

    param = "edge_weight" if weight else "edge_attr"
    scope: dict = {}
    exec(  # a forward whose edge data argument has this name
        f"def forward(self, x, edge_index, {name}=None):\n"
        f"    return self.conv(x, edge_index, {param}={name})",
        scope,
    )
    Net.forward = scope["forward"]
    with pytest.raises(ModelTraceError, match=f"accepts edge data '{name}'"):
        LayerwiseEvaluator(Net(), store)


def test_optional_extra_argument_is_specialized(store):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = SAGEConv(4, 3)

        def forward(self, x, edge_index, batch=None):
            if batch is None:
                return self.conv(x, edge_index)
            return self.conv(x, edge_index) * 0

    LayerwiseEvaluator(Net(), store)  # traced with batch=None: accepted
