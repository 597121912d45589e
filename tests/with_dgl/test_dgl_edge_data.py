"""DGL models taking edge data (``forward(g, x, edge_weight)`` / ``forward(g, x, efeat)``)
served from the graph store's edge columns equal their own full-graph forward: random
graphs with duplicate edges and self-loops, full and partial evaluation, batched with the
load-time self-check; without the column the model is refused naming the argument."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.nn.pytorch as dglnn  # noqa: E402
from support import assert_exact, random_edge_index  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.worker.trace.tracer import ModelTraceError  # noqa: E402

pytestmark = pytest.mark.dgl

D_IN, D_E = 6, 3


class Weighted(nn.Module):
    def __init__(self, conv1: nn.Module, conv2: nn.Module) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, g, x, edge_weight):
        h = self.conv1(g, x, edge_weight=edge_weight).flatten(1).relu()
        return self.conv2(g, h, edge_weight=edge_weight).flatten(1)


class EdgeFeat(nn.Module):
    def __init__(self, conv1, conv2, param: str, inp=None, first: bool = False) -> None:
        super().__init__()
        self.conv1, self.conv2, self.param, self.first = conv1, conv2, param, first
        self.inp = inp or nn.Identity()

    def _rows(self, out):
        return (out[0] if self.first else out).flatten(1)

    def forward(self, g, x, efeat):
        h = self._rows(self.conv1(g, self.inp(x), **{self.param: efeat})).relu()
        return self._rows(self.conv2(g, h, **{self.param: efeat}))


FAMILIES = {
    "graphconv_both": lambda: Weighted(dglnn.GraphConv(D_IN, 8), dglnn.GraphConv(8, 4)),
    "graphconv_left": lambda: Weighted(
        dglnn.GraphConv(D_IN, 3, norm="left"), dglnn.GraphConv(3, 4, norm="left")
    ),
    "graphconv_right": lambda: Weighted(
        dglnn.GraphConv(D_IN, 8, norm="right"), dglnn.GraphConv(8, 4, norm="none")
    ),
    "sage": lambda: Weighted(dglnn.SAGEConv(D_IN, 8, "mean"), dglnn.SAGEConv(8, 4, "gcn")),
    "gin": lambda: Weighted(
        dglnn.GINConv(nn.Linear(D_IN, 8), "sum"), dglnn.GINConv(nn.Linear(8, 4), "mean")
    ),
    "gat": lambda: Weighted(dglnn.GATConv(D_IN, 4, 2), dglnn.GATConv(8, 4, 1)),
    "nnconv": lambda: EdgeFeat(
        dglnn.NNConv(D_IN, 8, nn.Linear(D_E, D_IN * 8), "mean"),
        dglnn.NNConv(8, 4, nn.Linear(D_E, 32), "sum"),
        "efeat",
    ),
    "gmm": lambda: EdgeFeat(
        dglnn.GMMConv(D_IN, 8, D_E, 2, "mean"), dglnn.GMMConv(8, 4, D_E, 2, "sum"), "pseudo"
    ),
    "edgegat": lambda: EdgeFeat(
        dglnn.EdgeGATConv(D_IN, D_E, 4, num_heads=2),
        dglnn.EdgeGATConv(8, D_E, 4, num_heads=1),
        "edge_feat",
    ),
    "cfconv": lambda: EdgeFeat(
        dglnn.CFConv(D_IN, D_E, 8, 8), dglnn.CFConv(8, D_E, 8, 4), "edge_feats"
    ),
    "egat": lambda: EdgeFeat(
        dglnn.EGATConv(D_IN, D_E, 4, 5, num_heads=2),
        dglnn.EGATConv(8, D_E, 4, 2, num_heads=1),
        "efeats",
        first=True,
    ),
    "gatedgcn": lambda: EdgeFeat(
        dglnn.GatedGCNConv(D_IN, D_E, 8),
        dglnn.GatedGCNConv(8, D_E, 4, batch_norm=False),
        "edge_feat",
        first=True,
    ),  # fmt: skip
    "pna": lambda: EdgeFeat(
        dglnn.PNAConv(
            D_IN, 8, ["mean", "max"], ["identity", "amplification"], 1.5, edge_feat_size=D_E
        ),
        dglnn.PNAConv(8, 4, ["sum"], ["identity"], 1.5, edge_feat_size=D_E),
        "edge_feat",
    ),  # fmt: skip
    "gine": lambda: EdgeFeat(
        dglnn.GINEConv(nn.Linear(D_E, D_E)),
        dglnn.GINEConv(nn.Linear(D_E, 4)),
        "edge_feat",
        inp=nn.Linear(D_IN, D_E),
    ),  # fmt: skip
}


def _graph(n: int, e: int, seed: int):
    ei = random_edge_index(n, e, seed=seed)
    ei = torch.cat([ei, torch.arange(n).repeat(2, 1)], dim=1)  # no zero in-degree
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, D_IN, generator=gen)
    w = torch.rand(ei.shape[1], generator=gen) + 0.1
    ea = torch.randn(ei.shape[1], D_E, generator=gen)
    return ei, x, w, ea


def _case(family: str, ei, x, w, ea):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    value = w if isinstance(model, Weighted) else ea
    with torch.no_grad():
        want = model(dgl.graph((ei[0], ei[1]), num_nodes=x.shape[0]), x, value)
    return model, want


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(("seed", "reorder"), [(1, "rcmk"), (2, None)])
def test_dgl_edge_data_equals_forward(family, seed, reorder):
    ei, x, w, ea = _graph(30, 110, seed)
    model, want = _case(family, ei, x, w, ea)
    store = GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea, reorder=reorder)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=4, progress=False)  # self-check on
    assert_exact(ev.evaluate(), want, f"{family} full")
    targets = torch.tensor([29, 0, 5, 5, 17])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family} partial")


@pytest.mark.parametrize("family", ["graphconv_both", "gat", "nnconv"])
def test_dgl_medium_graph_and_weights_matter(family):
    ei, x, w, ea = _graph(500, 2500, 3)
    model, want = _case(family, ei, x, w, ea)
    store = GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=41, progress=False)
    got = ev.evaluate()
    assert_exact(got, want, f"{family} full")
    assert ev.last_stats.batches > ev.num_layers
    if family == "gat":  # the weighted full layers read the once-per-layer source table
        assert all(ly.gather_free for ly in ev.last_stats.layers if ly.layer > 0)
    other = _case(family, ei, x, torch.ones_like(w), torch.zeros_like(ea))[1]
    assert (got - other).abs().max() > 1e-2  # the edge data changes the answer


def test_dgl_square_graph_batches_without_edges(monkeypatch):
    """GatedGCNConv (square batch graph) on a graph with isolated nodes and batches of 2
    nodes: batches without any edge get zeros, as the full graph gives those nodes."""
    ei = random_edge_index(30, 12, seed=8)  # sparse: many nodes without in-edges
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(30, D_IN, generator=gen)
    ea = torch.randn(ei.shape[1], D_E, generator=gen)
    torch.manual_seed(0)
    model = FAMILIES["gatedgcn"]().eval()
    with torch.no_grad():
        want = model(dgl.graph((ei[0], ei[1]), num_nodes=30), x, ea)
    store = GraphStore.from_edge_index(ei, x, edge_attr=ea, reorder=None)
    from hopserve.worker.convs.dgl_square import DGLSquareAdapter

    edgeless, run = [], DGLSquareAdapter.run

    def counting(self, x, batch):
        edgeless.append(batch.num_edges == 0)
        return run(self, x, batch)

    monkeypatch.setattr(DGLSquareAdapter, "run", counting)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=1, progress=False)
    assert_exact(ev.evaluate(), want, "GatedGCNConv full, edgeless batches")
    assert any(edgeless), "no batch without edges: the case is not covered"
    targets = torch.tensor([29, 0, 3, 3])
    assert_exact(ev.evaluate(targets=targets), want[targets], "GatedGCNConv partial")


def test_dgl_egat_edge_output_feeding_a_conv_is_refused():
    """EGATConv's new edge features are per-edge values: a model that passes them on to the
    next conv cannot be split by layer (refused, node-wise fallback advised)."""

    class Chained(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = dglnn.EGATConv(D_IN, D_E, 4, D_E, num_heads=1)
            self.conv2 = dglnn.EGATConv(4, D_E, 4, D_E, num_heads=1)

        def forward(self, g, x, efeat):
            out = self.conv1(g, x, efeat)
            h, e = out[0].flatten(1), out[1].flatten(1)
            return self.conv2(g, h, e)[0].flatten(1)

    ei, x, w, ea = _graph(20, 60, 6)
    store = GraphStore.from_edge_index(ei, x, edge_attr=ea)
    with pytest.raises(ModelTraceError, match="conv2"):
        LayerwiseEvaluator(Chained().eval(), store)


def test_dgl_model_refused_without_the_column():
    ei, x, w, ea = _graph(20, 60, 4)
    model, _ = _case("graphconv_both", ei, x, w, ea)
    with pytest.raises(ModelTraceError, match=r"accepts edge data 'edge_weight'"):
        LayerwiseEvaluator(model, GraphStore.from_edge_index(ei, x, edge_attr=ea))
    model, _ = _case("nnconv", ei, x, w, ea)
    with pytest.raises(ModelTraceError, match=r"accepts edge data 'efeat'"):
        LayerwiseEvaluator(model, GraphStore.from_edge_index(ei, x, edge_weight=w))


@pytest.mark.parametrize("family", ["graphconv_both", "nnconv", "gat"])
def test_dgl_nodewise_fallback_passes_the_edge_data(family):
    """The sink node's extra edges get neutral edge data; targets' rows stay exact."""
    from hopserve.worker.engine.nodewise import NodewiseEvaluator

    ei, x, w, ea = _graph(200, 800, 5)
    model, want = _case(family, ei, x, w, ea)
    store = GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea)
    targets = torch.tensor([199, 0, 17, 17, 100])
    got = NodewiseEvaluator(model, store, batch_size=2).evaluate(targets=targets)
    assert_exact(got, want[targets], f"node-wise {family}")
