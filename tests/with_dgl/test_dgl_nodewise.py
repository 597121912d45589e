"""Node-wise fallback for DGL-style models: exact, including whole-graph out-degrees."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.nn as dglnn  # noqa: E402
from support import assert_exact, random_graph  # noqa: E402
from support.dgl_models import DGL, GCN, build  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import LayerwiseEvaluator, NodewiseEvaluator, make_evaluator  # noqa: E402
from hopserve.worker.trace import ModelTraceError  # noqa: E402

pytestmark = pytest.mark.dgl


class APPNPNet(nn.Module):
    """K-hop propagation inside one module: refused layer-wise, served node-wise."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
        self.prop = dglnn.APPNPConv(k=3, alpha=0.1)

    def forward(self, g, x):
        return self.prop(g, self.lin(x))


class DegreeScaled(nn.Module):
    """Reads the graph outside a conv (in-degrees): not layer-wise, fine node-wise."""

    def __init__(self):
        super().__init__()
        self.conv = dglnn.SAGEConv(5, 4, "mean")

    def forward(self, g, x):
        deg = g.in_degrees().float().clamp(min=1).unsqueeze(1)
        return self.conv(g, x) / deg


@pytest.fixture(scope="module")
def graph():
    return random_graph(250, 1200, 5, seed=8, x_seed=9)


@pytest.mark.parametrize("family", ["gcn_both", "gcn_left", "gat", "sage_pool", "jk_cat"])
def test_nodewise_matches_forward(graph, family):
    edge_index, x, store = graph
    model = build(family, 5, seed=2)
    want = DGL.forward(model, edge_index, x)
    ev = NodewiseEvaluator(model, store, batch_size=37)
    assert ev.style == "dgl"
    assert ev.out_degree_sink == family.startswith(("gcn", "jk"))  # GraphConv both/left
    assert_exact(ev.evaluate(), want, f"{family} node-wise full")
    targets = torch.tensor([0, 249, 17, 17])
    assert_exact(ev.evaluate(targets), want[targets], f"{family} node-wise partial")


@pytest.mark.parametrize(("model_cls", "hops"), [(APPNPNet, None), (DegreeScaled, 1)])
def test_fallback_serves_refused_dgl_models(graph, model_cls, hops):
    edge_index, x, store = graph
    torch.manual_seed(0)
    model = model_cls().eval()
    with pytest.raises(ModelTraceError):
        LayerwiseEvaluator(model, store)
    ev = make_evaluator(model, store, fallback="nodewise", hops=hops)
    assert ev.mode == "nodewise"
    assert ev.hops == (3 if hops is None else hops)  # APPNPConv's k
    ev.batch_size = 16  # fields far smaller than the graph
    want = DGL.forward(model, edge_index, x)
    assert_exact(ev.evaluate(), want, f"{model_cls.__name__} fallback")


def test_fallback_refuses_a_field_too_small_for_the_model(graph):
    """APPNP propagates 3 hops: served with hops=1 its rows would be wrong, so the
    load-time probe refuses it (it was served, and only a test whose one batch held the
    whole graph agreed with the forward)."""
    _, _, store = graph
    with pytest.raises(ValueError, match="more hops than 1"):
        make_evaluator(APPNPNet().eval(), store, fallback="nodewise", hops=1)


def test_nodewise_refuses_zero_in_degree_like_dgl(graph):
    _, _, store = graph  # the last node has no in-edge
    with pytest.raises(ModelTraceError, match="allow_zero_in_degree=False"):
        NodewiseEvaluator(GCN(5, zero_ok=False).eval(), store)


class DirGraphConv(nn.Module):
    """DGL's Dir-GNN idiom: ``GraphConv`` over the graph and over ``dgl.reverse(g)``, with
    ``norm="both"``: both ways, the reversed graph's source out-degrees are in-degrees,
    which the field completes with a degree hop (the sink only completes out-degrees)."""

    def __init__(self, norm: str):
        super().__init__()
        self.fwd = dglnn.GraphConv(5, 4, norm=norm, allow_zero_in_degree=True)
        self.rev = dglnn.GraphConv(5, 4, norm=norm, allow_zero_in_degree=True)

    def forward(self, g, x):
        return self.fwd(g, x) + self.rev(dgl.reverse(g), x)


@pytest.mark.parametrize("norm", ["both", "left", "right"])
def test_a_reversed_graph_conv_is_exact_with_the_field_both_ways(graph, norm):
    edge_index, x, store = graph
    torch.manual_seed(4)
    model = DirGraphConv(norm).eval()
    ev = NodewiseEvaluator(model, store, hops=1, batch_size=16)
    assert ev.both_ways
    assert_exact(ev.evaluate(), DGL.forward(model, edge_index, x), f"reversed GraphConv {norm}")
