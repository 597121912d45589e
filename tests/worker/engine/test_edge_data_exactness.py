"""Models taking edge data (``forward(x, edge_index, edge_weight)`` / ``(..., edge_attr)``)
served from the graph store's edge columns equal their own full-graph forward with the edge
data: random graphs with duplicate edges, self-loops and isolated nodes, full and partial
evaluation, a batched medium graph with the load-time self-check, and sampling. Without
the column, the model is refused at load naming the parameter; the weights matter (a
result without them differs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_exact, random_edge_index
from support.exactness import D_IN, MEDIUM_TARGETS, assert_full_and_partial, family_cases, graphs
from torch import nn
from torch_geometric import nn as pyg

from hopserve import GraphStore, LayerwiseEvaluator, make_evaluator
from hopserve.worker.graph.planner import sample_in_edges
from hopserve.worker.trace.tracer import ModelTraceError

D_E = 3  # edge feature width
H = 8


class WeightedTwo(nn.Module):
    """Two convs taking edge weights: ``conv2(relu(conv1(x, w)), w)``."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, edge_index, edge_weight=None):
        h = self.conv1(x, edge_index, edge_weight).relu()
        return self.conv2(h, edge_index, edge_weight)


class AttrTwo(nn.Module):
    """Two convs taking edge features (``edge_attr=``), heads flattened; an input
    projection for width-keeping convs."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module | None = None):
        super().__init__()
        self.inp = inp or nn.Identity()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, edge_index, edge_attr):
        h = self.conv1(self.inp(x), edge_index, edge_attr=edge_attr).flatten(1).relu()
        return self.conv2(h, edge_index, edge_attr=edge_attr).flatten(1)


class MixedWeighted(nn.Module):
    """A weighted GCN layer, then an unweighted SAGE layer reading a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg.GCNConv(D_IN, H)
        self.conv2 = pyg.SAGEConv(H, 4)
        self.skip = nn.Linear(D_IN, 4)

    def forward(self, x, edge_index, edge_weight=None):
        h = self.conv1(x, edge_index, edge_weight).relu()
        return self.conv2(h, edge_index) + self.skip(x)


def _mlp(a: int, b: int) -> nn.Module:
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b))


WEIGHTED = {
    "gcn": lambda: WeightedTwo(pyg.GCNConv(D_IN, H), pyg.GCNConv(H, 4)),
    "gcn_improved": lambda: WeightedTwo(
        pyg.GCNConv(D_IN, H, improved=True), pyg.GCNConv(H, 4, improved=True)
    ),
    "gcn_no_loops": lambda: WeightedTwo(
        pyg.GCNConv(D_IN, H, add_self_loops=False), pyg.GCNConv(H, 4, add_self_loops=False)
    ),
    "gcn_no_norm": lambda: WeightedTwo(
        pyg.GCNConv(D_IN, H, normalize=False), pyg.GCNConv(H, 4, normalize=False)
    ),
    "graphconv": lambda: WeightedTwo(pyg.GraphConv(D_IN, H), pyg.GraphConv(H, 4, aggr="mean")),
    "leconv": lambda: WeightedTwo(pyg.LEConv(D_IN, H), pyg.LEConv(H, 4)),
    "lgconv": lambda: WeightedTwo(pyg.LGConv(), pyg.LGConv()),
    "mixed": MixedWeighted,
}

ATTR = {
    "gat": lambda: AttrTwo(
        pyg.GATConv(D_IN, 4, heads=2, edge_dim=D_E), pyg.GATConv(8, 4, heads=2, edge_dim=D_E)
    ),
    "gat_no_loops": lambda: AttrTwo(
        pyg.GATConv(D_IN, 4, heads=2, edge_dim=D_E, add_self_loops=False),
        pyg.GATConv(8, 4, edge_dim=D_E, add_self_loops=False),
    ),
    "gatv2": lambda: AttrTwo(
        pyg.GATv2Conv(D_IN, 4, heads=2, edge_dim=D_E), pyg.GATv2Conv(8, 4, edge_dim=D_E)
    ),
    "transformer": lambda: AttrTwo(
        pyg.TransformerConv(D_IN, 4, heads=2, edge_dim=D_E),
        pyg.TransformerConv(8, 4, edge_dim=D_E),
    ),
    "gine": lambda: AttrTwo(
        pyg.GINEConv(_mlp(D_IN, H), edge_dim=D_E), pyg.GINEConv(_mlp(H, 4), edge_dim=D_E)
    ),
    "nnconv": lambda: AttrTwo(
        pyg.NNConv(D_IN, H, nn.Linear(D_E, D_IN * H)), pyg.NNConv(H, 4, nn.Linear(D_E, H * 4))
    ),
    "cgconv": lambda: AttrTwo(
        pyg.CGConv(H, dim=D_E), pyg.CGConv(H, dim=D_E), inp=nn.Linear(D_IN, H)
    ),
    "genconv": lambda: AttrTwo(
        pyg.GENConv(D_IN, H, edge_dim=D_E), pyg.GENConv(H, 4, edge_dim=D_E, aggr="powermean")
    ),
    "generalconv": lambda: AttrTwo(
        pyg.GeneralConv(D_IN, H, in_edge_channels=D_E),
        pyg.GeneralConv(H, 4, in_edge_channels=D_E, attention=True, heads=2),
    ),
    "resgated": lambda: AttrTwo(
        pyg.ResGatedGraphConv(D_IN, H, edge_dim=D_E), pyg.ResGatedGraphConv(H, 4, edge_dim=D_E)
    ),
    "gmm": lambda: AttrTwo(
        pyg.GMMConv(D_IN, H, dim=D_E, kernel_size=2), pyg.GMMConv(H, 4, dim=D_E, kernel_size=2)
    ),
}


def _edge_data(num_edges: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive weights (GCN degrees stay positive) and normal edge features."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(num_edges, generator=gen) + 0.1, torch.randn(num_edges, D_E, generator=gen)


def _model(family: str) -> tuple[nn.Module, str]:
    torch.manual_seed(0)
    if family in WEIGHTED:
        return WEIGHTED[family]().eval(), "edge_weight"
    return ATTR[family]().eval(), "edge_attr"


def _forward(model: nn.Module, arg: str, x, edge_index, value) -> torch.Tensor:
    with torch.no_grad():
        return model(x, edge_index, **{arg: value})


def _store(edge_index, x, w, ea, reorder="rcmk") -> GraphStore:
    return GraphStore.from_edge_index(edge_index, x, edge_weight=w, edge_attr=ea, reorder=reorder)


# --------------------------------------------------------------------------- random graphs
@family_cases({**WEIGHTED, **ATTR}, 10, graphs())
def test_random_graphs_with_edge_data_equal_forward(family, case):
    edge_index, x, targets, reorder = case
    model, arg = _model(family)
    w, ea = _edge_data(edge_index.shape[1], seed=int(x.abs().sum() * 1000) % 2**16)
    want = _forward(model, arg, x, edge_index, w if arg == "edge_weight" else ea)
    ev = LayerwiseEvaluator(
        model, _store(edge_index, x, w, ea, reorder), init_batch_nodes=3, self_check=False,
        progress=False,
    )  # fmt: skip
    assert_full_and_partial(ev, want, targets, family)


# --------------------------------------------------------------------------- medium graph
@pytest.fixture(scope="module")
def medium():
    ei = random_edge_index(600, 3000, seed=1)
    x = torch.randn(600, D_IN, generator=torch.Generator().manual_seed(2))
    w, ea = _edge_data(ei.shape[1], seed=3)
    return ei, x, w, ea, _store(ei, x, w, ea)


@pytest.mark.parametrize("family", ["gcn", "gcn_improved", "mixed", "gat", "gine", "nnconv"])
def test_medium_graph_batched_with_self_check(medium, family):
    ei, x, w, ea, store = medium
    model, arg = _model(family)
    want = _forward(model, arg, x, ei, w if arg == "edge_weight" else ea)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=37, progress=False)  # self-check on
    assert_exact(ev.evaluate(), want, f"{family} full")
    assert ev.last_stats.batches > ev.num_layers
    targets = torch.tensor([599, 0, 17, 17, 300, 42])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family} partial")
    exact_again = ev.evaluate(targets=targets, fanouts=[-1] * ev.num_layers)
    assert_exact(exact_again, want[targets], f"{family} fanouts=-1")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("resident", [True, False], ids=["graph-on-device", "graph-on-host"])
@pytest.mark.parametrize("family", ["gcn", "mixed", "gat", "gine", "nnconv"])
def test_cuda_medium_graph_with_edge_data(medium, family, resident):
    """Edge columns reach the GPU (resident, or sliced per batch from the host). A node's
    several self-loops get one weight: which of them PyG's forward keeps is unspecified on
    CUDA (an indexed assignment with repeated indices), so it would be no fixed oracle."""
    ei, x, w, ea, _ = medium
    w = w.clone()
    loops = (ei[0] == ei[1]).nonzero().squeeze(1)
    w[loops] = 0.5 + ei[0, loops] / 600.0
    store = _store(ei, x, w, ea)
    model, arg = _model(family)
    want = _forward(model, arg, x, ei, w if arg == "edge_weight" else ea)  # before .cuda()
    ev = LayerwiseEvaluator(
        model, store, device="cuda", init_batch_nodes=37, graph_on_device=resident,
        progress=False,
    )  # fmt: skip
    assert ev.graph_resident is resident
    assert_full_and_partial(ev, want, torch.tensor([599, 0, 17, 300]), family, " on cuda")


def test_dropping_the_weights_changes_the_result(medium):
    """The test can fail: the served rows are those of the weighted forward, which is far
    from the unweighted one (and from the weights shuffled over the edges)."""
    ei, x, w, ea, store = medium
    model, _ = _model("gcn")
    got = LayerwiseEvaluator(model, store, progress=False).evaluate()
    assert_exact(got, _forward(model, "edge_weight", x, ei, w), "weighted")
    for other in (None, w[torch.randperm(w.numel(), generator=torch.Generator().manual_seed(0))]):
        far = (got - _forward(model, "edge_weight", x, ei, other)).abs().max().item()
        assert far > 1e-2, f"the weights changed nothing ({far})"
    model, _ = _model("gine")
    got = LayerwiseEvaluator(model, store, progress=False).evaluate()
    far = (got - _forward(model, "edge_attr", x, ei, torch.zeros_like(ea))).abs().max().item()
    assert far > 1e-2


# --------------------------------------------------------------------------- sampling
def _sampled_rows(store: GraphStore, fanout: int, layer: int, seed: int, column: str):
    """``G_l`` in external IDs and its edges' rows of ``column`` (CSC order)."""
    topo = store.topology
    nodes = np.arange(store.num_nodes)
    local, pos = sample_in_edges(topo.indptr, nodes, fanout, layer, seed)
    src = torch.from_numpy(topo.indices[pos].astype(np.int64))
    dst = torch.from_numpy(np.repeat(nodes, np.diff(local)))
    ei = torch.stack([store.to_external(src), store.to_external(dst)])
    return ei, getattr(store, column)[torch.from_numpy(np.asarray(pos, dtype=np.int64))]


@pytest.mark.parametrize("family", ["gcn", "gcn_no_loops", "gcn_no_norm", "graphconv"])
@pytest.mark.parametrize("fanouts", [[2, 3], [1, -1], [5, 1]])
def test_sampling_with_weights_equals_the_sampled_forward(medium, family, fanouts):
    ei, x, w, ea, store = medium
    model, _ = _model(family)
    ev = LayerwiseEvaluator(model, store, progress=False)
    targets = torch.tensor(MEDIUM_TARGETS[1:]) % 600
    got = ev.evaluate(targets=targets, fanouts=fanouts, seed=7)
    (e1, w1), (e2, w2) = (
        _sampled_rows(store, f, layer, 7, "edge_weight")
        for layer, f in ((1, fanouts[0]), (2, fanouts[1]))
    )
    with torch.no_grad():
        want = model.conv2(model.conv1(x, e1, w1).relu(), e2, w2)
    assert_exact(got, want[targets], f"{family} sampled {fanouts}")


@family_cases(
    ["gcn", "gcn_improved", "gat", "gine", "nnconv", "graphconv"], 8, graphs(hub=True, layers=2)
)
def test_random_graphs_sampled_with_edge_data_equal_the_sampled_forward(family, case):
    """Sampling evaluation on G_l: each layer's convs see the sampled edges with their own
    rows of edge data (GCN: degrees summed over G_l's weights)."""
    edge_index, x, targets, reorder, fanouts, seed = case
    model, arg = _model(family)
    w, ea = _edge_data(edge_index.shape[1], seed=7)
    store = _store(edge_index, x, w, ea, reorder)
    column = "edge_weight" if arg == "edge_weight" else "edge_features"
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    got = ev.evaluate(targets=targets, fanouts=fanouts, seed=seed)
    (e1, v1), (e2, v2) = (
        _sampled_rows(store, f, layer, seed, column)
        for layer, f in ((1, fanouts[0]), (2, fanouts[1]))
    )
    with torch.no_grad():
        if isinstance(model, AttrTwo):
            h = model.conv1(model.inp(x), e1, edge_attr=v1).flatten(1).relu()
            want = model.conv2(h, e2, edge_attr=v2).flatten(1)
        else:
            want = model.conv2(model.conv1(x, e1, v1).relu(), e2, v2)
    assert_exact(got, want[targets], f"{family} sampled {fanouts}")


# --------------------------------------------------------------------------- refusals
def test_model_refused_without_the_column_naming_the_parameter():
    ei = random_edge_index(30, 90, seed=4)
    x = torch.randn(30, D_IN)
    plain = GraphStore.from_edge_index(ei, x)
    model, _ = _model("gcn")
    with pytest.raises(ModelTraceError, match=r"accepts edge data 'edge_weight'.*does not hold"):
        LayerwiseEvaluator(model, plain)
    with pytest.raises(ModelTraceError, match="edge_weight"):  # and never node-wise without it
        make_evaluator(model, plain, fallback="nodewise")
    weights_only = GraphStore.from_edge_index(ei, x, edge_weight=torch.rand(ei.shape[1]))
    model, _ = _model("gat")
    with pytest.raises(ModelTraceError, match=r"accepts edge data 'edge_attr'.*edge_features"):
        LayerwiseEvaluator(model, weights_only)
    narrow = GraphStore.from_edge_index(ei, x, edge_attr=torch.randn(ei.shape[1], 2))
    with pytest.raises(ModelTraceError, match=r"edge features are 2 wide.*expects 3"):
        LayerwiseEvaluator(model, narrow)


def test_edge_data_used_outside_a_conv_is_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = pyg.GCNConv(D_IN, 4)

        def forward(self, x, edge_index, edge_weight=None):
            return self.conv(x, edge_index, edge_weight.sigmoid())

    ei = random_edge_index(20, 60, seed=5)
    store = GraphStore.from_edge_index(
        ei, torch.randn(20, D_IN), edge_weight=torch.rand(ei.shape[1])
    )
    with pytest.raises(ModelTraceError, match="edge data input 'edge_weight' is used outside"):
        LayerwiseEvaluator(Net(), store)


def test_conv_without_edge_support_called_with_edge_data_is_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = pyg.EGConv(D_IN, 4, num_heads=2, num_bases=2)
            self.gcn = pyg.GCNConv(4, 4)

        def forward(self, x, edge_index, edge_weight=None):
            return self.gcn(self.conv(x, edge_index), edge_index, edge_weight)

    ei = random_edge_index(20, 60, seed=6)
    store = GraphStore.from_edge_index(
        ei, torch.randn(20, D_IN), edge_weight=torch.rand(ei.shape[1])
    )
    LayerwiseEvaluator(Net(), store)  # EGConv gets no edge data: fine
    with pytest.raises(ModelTraceError, match="edge_attr"):  # GCN takes weights only

        class Wrong(Net):
            def forward(self, x, edge_index, edge_attr=None):
                return self.gcn(self.conv(x, edge_index), edge_index, edge_attr)

        LayerwiseEvaluator(Wrong(), store)


def test_pdnconv_weights_from_edge_features(medium):
    """PDNConv's weights come from its mlp over each edge's features; its normalization
    sums the sources' weights over the whole graph (adapted), full, partial and sampled
    against the forward (sampled: on G_l with its edges' features)."""
    ei, x, w, ea, store = medium
    torch.manual_seed(0)
    model = AttrTwo(
        pyg.PDNConv(D_IN, H, edge_dim=D_E, hidden_channels=4),
        pyg.PDNConv(H, 4, edge_dim=D_E, hidden_channels=4, add_self_loops=False),
    ).eval()
    want = _forward(model, "edge_attr", x, ei, ea)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=53, progress=False)
    assert_exact(ev.evaluate(), want, "PDNConv full")
    targets = torch.tensor([599, 0, 17, 17, 300])
    assert_exact(ev.evaluate(targets=targets), want[targets], "PDNConv partial")
    topo = store.topology
    nodes = np.arange(store.num_nodes)
    graphs = []
    for layer, fanout in ((1, 3), (2, 2)):
        local, pos = sample_in_edges(topo.indptr, nodes, fanout, layer, 5)
        pos_t = torch.from_numpy(np.asarray(pos, dtype=np.int64))
        src = store.to_external(torch.from_numpy(topo.indices[pos].astype(np.int64)))
        dst = store.to_external(torch.from_numpy(np.repeat(nodes, np.diff(local))))
        graphs.append((torch.stack([src, dst]), store.edge_features[pos_t]))
    with torch.no_grad():
        (e1, a1), (e2, a2) = graphs
        h = model.conv1(x, e1, edge_attr=a1).relu()
        sampled = model.conv2(h, e2, edge_attr=a2)
    got = ev.evaluate(targets=targets, fanouts=[3, 2], seed=5)
    assert_exact(got, sampled[targets], "PDNConv sampled")


# --------------------------------------------------------------------------- node-wise
def test_nodewise_fallback_passes_the_edge_data(medium):
    """A model the layer-wise split refuses (an op on the weights outside the convs) is
    served node-wise with the subgraph's edge data; plain edge-data models too."""
    from hopserve.worker.engine.nodewise import NodewiseEvaluator

    class SquashedWeights(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = pyg.GCNConv(D_IN, H), pyg.GCNConv(H, 4)

        def forward(self, x, edge_index, edge_weight=None):
            w = edge_weight.sigmoid()
            return self.conv2(self.conv1(x, edge_index, w).relu(), edge_index, w)

    ei, x, w, ea, store = medium
    torch.manual_seed(0)
    model = SquashedWeights().eval()
    ev = make_evaluator(model, store, fallback="nodewise", hops=2)
    assert ev.mode == "nodewise"
    targets = torch.tensor([599, 0, 17, 17, 300])
    want = _forward(model, "edge_weight", x, ei, w)
    assert_exact(ev.evaluate(targets=targets), want[targets], "node-wise weighted")
    for family in ("gcn", "gat"):
        model, arg = _model(family)
        want = _forward(model, arg, x, ei, w if arg == "edge_weight" else ea)
        got = NodewiseEvaluator(model, store).evaluate(targets=targets)
        assert_exact(got, want[targets], f"node-wise {family}")
