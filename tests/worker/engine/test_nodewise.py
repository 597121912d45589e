"""The node-wise fallback: slow but exact for models the layer-wise engine refuses.

Its receptive field runs over in-edges or, for models reading out-neighbours too
(``DirGNNConv``), both ways; models whose rows depend on nodes outside any such field are
refused at load by the probe check.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_exact, random_edge_index, random_graph
from support.models import LinAPPNP, OneConv, build
from torch import nn
from torch_geometric.nn import (
    DirGNNConv,
    GATConv,
    GCNConv,
    GINConv,
    GPSConv,
    GraphNorm,
    SAGEConv,
    SGConv,
    WLConv,
)

from hopserve import LayerwiseEvaluator, NodewiseEvaluator, make_evaluator
from hopserve.worker.graph import GraphStore
from hopserve.worker.trace import ModelTraceError


class APPNPNet(LinAPPNP):
    def __init__(self):
        super().__init__(nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3)), k=4)


class SGC(OneConv):
    def __init__(self):
        super().__init__(SGConv(5, 3, K=2))


class Branchy(nn.Module):
    """Untraceable (data-dependent branch), so its receptive field must be given."""

    def __init__(self):
        super().__init__()
        self.inner = build("sage_mean", 5)

    def forward(self, x, edge_index):
        if x.abs().sum() >= 0:
            return self.inner(x, edge_index)
        return x


@pytest.fixture(scope="module")
def graph():
    return random_graph(250, 1200, 5, seed=8, x_seed=9)


@pytest.mark.parametrize("model_cls", [APPNPNet, SGC])
def test_fallback_is_exact_for_refused_models(graph, model_cls):
    edge_index, x, store = graph
    model = model_cls().eval()
    with pytest.raises(ModelTraceError):
        LayerwiseEvaluator(model, store)
    ev = make_evaluator(model, store, fallback="nodewise")
    assert ev.mode == "nodewise"
    with torch.no_grad():
        want = model(x, edge_index)
    ids = torch.tensor([0, 249, 13, 13])
    assert_exact(ev.evaluate(targets=ids), want[ids], model_cls.__name__)
    assert_exact(ev.evaluate(), want, model_cls.__name__ + " all")


def test_hops_inferred_from_k_hop_convs():
    assert NodewiseEvaluator.__init__  # import check
    from hopserve.worker.engine.nodewise import infer_hops

    assert infer_hops(APPNPNet()) == 4
    assert infer_hops(build("sage_mean", 5)) == 3


def test_untraceable_model_needs_hops(graph):
    edge_index, x, store = graph
    model = Branchy().eval()
    with pytest.raises(ValueError, match="hops"):
        make_evaluator(model, store, fallback="nodewise")
    ev = make_evaluator(model, store, fallback="nodewise", hops=3)
    ids = torch.tensor([3, 100])
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), model(x, edge_index)[ids], "branchy")


def test_nodewise_baseline_matches_layerwise(graph):
    edge_index, x, store = graph
    model = build("gcn", 5)
    ids = torch.tensor([7, 8, 200])
    a = NodewiseEvaluator(model, store, batch_size=2).evaluate(ids)
    b = LayerwiseEvaluator(model, store).evaluate(ids)
    assert_exact(a, b, "node-wise vs layer-wise")


# ----------------------------------------------------------------- the field, both ways
class DirNet(nn.Module):
    """Two DirGNNConv layers (in- and out-neighbours, Rossi et al. 2023) over ``inner``."""

    def __init__(self, inner: str):
        super().__init__()
        make = {
            "sage": lambda i, o: SAGEConv(i, o),
            "gcn": lambda i, o: GCNConv(i, o),
            "gat": lambda i, o: GATConv(i, o, heads=1),
        }[inner]
        self.c1 = DirGNNConv(make(5, 8), alpha=0.3)
        self.c2 = DirGNNConv(make(8, 3), alpha=0.6, root_weight=False)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


class Flipped(nn.Module):
    """Aggregates out-neighbours through the user's own flip of ``edge_index``."""

    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(5, 4)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index.flip(0))


@settings(max_examples=12, deadline=None)
@given(
    inner=st.sampled_from(["sage", "gcn", "gat"]),
    n=st.integers(2, 60),
    density=st.floats(0.0, 4.0),
    seed=st.integers(0, 10_000),
)
def test_dirgnn_is_exact_node_wise_with_its_field_both_ways(inner, n, density, seed):
    edge_index = random_edge_index(n, int(n * density), seed=seed)
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(seed))
    store = GraphStore.from_edge_index(edge_index, x)
    torch.manual_seed(seed)
    model = DirNet(inner).eval()
    with pytest.raises(ModelTraceError, match="DirGNNConv"):
        LayerwiseEvaluator(model, store)
    ev = make_evaluator(model, store, fallback="nodewise")
    assert ev.both_ways and "in- and out-edges" in ev.describe()
    ev.batch_size = 4  # fields far smaller than the graph
    with torch.no_grad():
        want = model(x, edge_index)
    assert_exact(ev.evaluate(), want, f"DirGNN({inner}) node-wise, all")
    ids = torch.tensor([n - 1, 0, n // 2, 0])
    assert_exact(ev.evaluate(ids), want[ids], f"DirGNN({inner}) node-wise, partial")


def test_a_forward_flipping_edges_gets_the_field_both_ways(graph):
    edge_index, x, store = graph
    model = Flipped().eval()
    ev = NodewiseEvaluator(model, store, hops=1, batch_size=8)
    assert ev.both_ways
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "flipped")


def test_dirgnn_counts_the_hops_of_the_conv_it_wraps(graph):
    """DirGNNConv(TAGConv(K=2)) propagates 2 hops each way: the field is 4 hops for two
    layers (it was refused as 2), and exact."""
    from torch_geometric.nn import TAGConv

    from hopserve.worker.engine.nodewise import infer_hops

    class DirTAG(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = DirGNNConv(TAGConv(5, 6, K=2))
            self.c2 = DirGNNConv(TAGConv(6, 3, K=2))

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index)

    edge_index, x, store = graph
    torch.manual_seed(3)
    model = DirTAG().eval()
    assert infer_hops(model) == 4
    ev = NodewiseEvaluator(model, store, batch_size=8)
    assert ev.both_ways
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "DirGNN(TAGConv K=2)")


def test_in_edge_models_keep_the_in_edge_field(graph):
    assert not NodewiseEvaluator(build("gcn", 5), graph[2]).both_ways


class Normed(nn.Module):
    """GraphNorm: every row is normalized by the whole graph's mean and spread."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = SAGEConv(5, 4), GraphNorm(4)

    def forward(self, x, edge_index):
        return self.norm(self.conv(x, edge_index))


class GlobalAttention(nn.Module):
    """GPSConv: a local conv plus attention over every node of the graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 8)
        self.gps = GPSConv(8, GINConv(nn.Linear(8, 8)), heads=2)

    def forward(self, x, edge_index):
        return self.gps(self.lin(x), edge_index)


class Pooled(nn.Module):
    """Each row plus the graph's mean row (a global readout broadcast back)."""

    def __init__(self):
        super().__init__()
        self.conv = SAGEConv(5, 4)

    def forward(self, x, edge_index):
        h = self.conv(x, edge_index)
        return h + h.mean(dim=0, keepdim=True)


class DeepSAGE(nn.Module):
    """Seven SAGE layers: a field of 5 hops is two short, and on a dense probe graph a
    5-hop field (6 with both ways) already held every node (review finding)."""

    def __init__(self):
        super().__init__()
        dims = [5] + [8] * 6 + [3]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:], strict=False))

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            x = x.relu() if i < len(self.convs) - 1 else x
        return x


@pytest.mark.parametrize(
    ("model_cls", "hops"),
    [
        (Normed, None),
        (GlobalAttention, 1),
        (Pooled, None),
        (lambda: build("sage_mean", 5), 2),
        (DeepSAGE, 5),
    ],
    ids=["GraphNorm", "GPSConv", "mean-readout", "hops-too-small", "deep-hops-one-short"],
)
def test_rows_depending_on_nodes_outside_the_field_are_refused(graph, model_cls, hops):
    """Served node-wise these were silently wrong (e.g. GraphNorm by 0.2): now refused
    at load, naming why."""
    _, _, store = graph
    with pytest.raises(ValueError, match="differs from its own forward on a probe graph"):
        NodewiseEvaluator(model_cls().eval(), store, hops=hops)


def test_a_model_failing_its_own_forward_on_the_probe_is_refused(graph):
    """WLConv takes one-hot colours; on float features its own forward fails, so there
    is nothing to check node-wise rows against (its colouring is global anyway)."""

    class Colours(nn.Module):
        def __init__(self):
            super().__init__()
            self.wl = WLConv()

        def forward(self, x, edge_index):
            return self.wl(x, edge_index)

    with pytest.raises(ValueError, match="own forward fails on a random probe graph"):
        NodewiseEvaluator(Colours(), graph[2], hops=1)


def test_fields_holding_half_the_graph_run_the_whole_graph_once(graph):
    """On a dense graph a batch's 2-hop field both ways holds most nodes: the model's own
    forward on the whole graph runs once instead of once a batch; on a sparse one the
    batches run. Both exact, full and partial."""
    from hopserve.worker.trace.probe import probe_graph

    sparse_ei = probe_graph(400, seed=3, degree=2, local=True)
    sparse_x = torch.randn(400, 5, generator=torch.Generator().manual_seed(4))
    sparse = (sparse_ei, sparse_x, GraphStore.from_edge_index(sparse_ei, sparse_x))
    torch.manual_seed(6)
    model = DirNet("sage").eval()
    for (edge_index, x, store), batches in ((graph, 1), (sparse, 400 // 8)):
        ev = NodewiseEvaluator(model, store, batch_size=8)
        with torch.no_grad():
            want = model(x, edge_index)
        assert_exact(ev.evaluate(), want, "DirGNN node-wise, all")
        assert ev.last_stats.layers[0].batches == batches
        ids = torch.arange(0, x.shape[0], 3)
        assert_exact(ev.evaluate(ids), want[ids], "DirGNN node-wise, partial")


def test_a_hub_s_field_of_few_edges_keeps_the_batches():
    """A batch holding a hub (every node points at it) has a field of every node but few
    of the edges (the rest are a clique among half the nodes): the whole-graph forward
    would cost far more than the batches, so they run (review finding), exact."""
    n = 200
    hub = torch.stack([torch.arange(1, n), torch.zeros(n - 1, dtype=torch.long)])
    block = torch.arange(100, n)
    clique = torch.stack([block.repeat_interleave(100), block.repeat(100)])
    edge_index = torch.cat([hub, clique], dim=1)
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(2))
    store = GraphStore.from_edge_index(edge_index, x, reorder=None)
    model = OneConv(SAGEConv(5, 3)).eval()
    ev = NodewiseEvaluator(model, store, batch_size=8)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "hub")
    assert ev.last_stats.layers[0].batches == n // 8
    assert_exact(ev.evaluate(torch.tensor([], dtype=torch.long)), torch.empty(0), "no targets")
