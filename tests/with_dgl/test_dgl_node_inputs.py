"""DGL convs with a second per-node input: ``GCN2Conv`` (``feat_0`` on destination rows,
whole-graph in-degree norms) and ``EGNNConv`` (coordinates in, coordinates out). Each equals
the model's own forward in many batches, on random graphs and sampled (``G_l``'s degrees).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from dgl.nn.pytorch import EGNNConv, GCN2Conv  # noqa: E402
from support import assert_exact, sampling  # noqa: E402
from support.dgl_models import DGL  # noqa: E402
from support.exactness import (  # noqa: E402
    D_IN,
    MEDIUM_TARGETS,
    assert_full_and_partial,
    check_medium_graph,
    check_random_graph,
    examples,
    family_cases,
    graphs,
)

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.worker.graph.planner import sample_in_edges  # noqa: E402
from hopserve.worker.trace import ModelTraceError, split_model  # noqa: E402

pytestmark = pytest.mark.dgl


class DGLGCNII(nn.Module):
    """GCNII as DGL's example writes it: ``x_0 = relu(fc_in(x))``, GCN2Convs reading
    ``x_0`` (``layer=i+1``), then ``fc_out``."""

    def __init__(self, layers: int = 3, hidden: int = 8, project: bool = True) -> None:
        super().__init__()
        self.fc_in = nn.Linear(D_IN, hidden)
        self.convs = nn.ModuleList(
            GCN2Conv(
                hidden,
                layer=i + 1,
                alpha=0.2,
                lambda_=0.7,
                project_initial_features=project,
                allow_zero_in_degree=True,
            )
            for i in range(layers)
        )
        self.fc_out = nn.Linear(hidden, 3)

    def forward(self, g, x):
        h = x_0 = self.fc_in(x).relu()
        for conv in self.convs:
            h = conv(g, h, x_0).relu()
        return self.fc_out(h)


class DGLEGNN(nn.Module):
    """Two EGNN layers: coordinates start as the features' first 3 columns and each layer
    updates them (``h, pos = conv(g, h, pos)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in = nn.Linear(D_IN, 8)
        self.conv1, self.conv2 = EGNNConv(8, 8, 8), EGNNConv(8, 8, 4)

    def forward(self, g, x):
        h, pos = self.conv1(g, self.fc_in(x), x[:, :3])
        h, pos = self.conv2(g, h.relu(), pos)
        return torch.cat([h, pos], dim=1)


def _model(family: str) -> nn.Module:
    torch.manual_seed(4)
    if family == "egnn":
        return DGLEGNN().eval()
    return DGLGCNII(project=family == "gcnii").eval()


FAMILIES = ["gcnii", "gcnii-two-weights", "egnn"]


@pytest.mark.parametrize("family", FAMILIES)
def test_medium_graph_many_batches(family, medium_graph):
    check_medium_graph(DGL, _model(family), medium_graph, family)


@family_cases(FAMILIES, 20, graphs())
def test_random_graphs(family, case):
    check_random_graph(DGL, _model(family), case, family)


@pytest.mark.parametrize("family", ["gcnii", "egnn"])
def test_medium_graph_sampled(family, medium_graph):
    """GCN2Conv's norms use G_l's in-degrees (min(d, f)) for sources and destinations."""
    runs = [([3, 2, 2], 7), ([-1, 1, 4], 0)] if family == "gcnii" else [([3, 2], 7)]
    sampling.check_medium_graph(DGL, _model(family), medium_graph, runs, family)


def test_feat_0_is_read_on_destination_rows_only():
    split = split_model(_model("gcnii"), D_IN)
    for block in split.blocks[2:]:
        reads = {i.name: i.rows for i in block.inputs if i.producer == 0}
        assert reads and set(reads.values()) == {"dst"}, split.describe()


class RawFeaturesX0(nn.Module):
    """``feat_0`` is the feature input itself, from the store, read on destination rows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCN2Conv(D_IN, layer=1, alpha=0.3, allow_zero_in_degree=True)
        self.conv2 = GCN2Conv(D_IN, layer=2, alpha=0.3, allow_zero_in_degree=True)

    def forward(self, g, x):
        return self.conv2(g, self.conv1(g, x, x).relu(), x)


def test_raw_features_as_feat_0(medium_graph):
    torch.manual_seed(6)
    check_medium_graph(DGL, RawFeaturesX0().eval(), medium_graph, "raw feat_0")


class OwnForward(GCN2Conv):
    def forward(self, graph, feat, feat_0, edge_weight=None):
        return 2 * super().forward(graph, feat, feat_0, edge_weight)


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = OwnForward(D_IN, layer=1)

    def forward(self, g, x):
        return self.conv(g, x, x)


def test_a_subclass_with_its_own_forward_is_refused():
    with pytest.raises(ModelTraceError, match="subclass of GCN2Conv overriding forward"):
        split_model(Wrapped().eval(), D_IN)


# --------------------------------------------------------------------------- edge weights
class WeightedGCNII(nn.Module):
    """GCNII with edge weights: every ``GCN2Conv`` gets ``edge_weight`` (DGL then normalizes
    with ``EdgeWeightNorm("both")``: weighted whole-graph out- and in-degrees)."""

    def __init__(self, project: bool = True) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.fc_in = nn.Linear(D_IN, 8)
        self.convs = nn.ModuleList(
            GCN2Conv(
                8,
                layer=i + 1,
                alpha=0.2,
                lambda_=0.7,
                project_initial_features=project,
                allow_zero_in_degree=True,
            )
            for i in range(3)
        )
        self.fc_out = nn.Linear(8, 3)

    def on_graphs(self, graphs, x, weights):
        """Layer ``i``'s conv on ``graphs[i]`` with ``weights[i]`` (the sampling oracle)."""
        h = x_0 = self.fc_in(x).relu()
        for conv, g, w in zip(self.convs, graphs, weights, strict=True):
            h = conv(g, h, x_0, edge_weight=w).relu()
        return self.fc_out(h)

    def forward(self, g, x, edge_weight):
        return self.on_graphs([g] * 3, x, [edge_weight] * 3)


def _weights(num_edges: int, seed: int) -> torch.Tensor:
    """Positive weights spanning two orders of magnitude (degrees then differ from counts)."""
    gen = torch.Generator().manual_seed(seed)
    return 10 ** (2 * torch.rand(num_edges, generator=gen) - 1)


def _weighted_forward(model, edge_index, x, w):
    g = dgl.graph((edge_index[0], edge_index[1]), num_nodes=x.shape[0])
    with torch.no_grad():
        return model(g, x, w)


@pytest.mark.parametrize("project", [True, False])
def test_edge_weights_medium_graph_many_batches(project, medium_graph):
    edge_index, x, _ = medium_graph
    w = _weights(edge_index.shape[1], 1)
    model = WeightedGCNII(project).eval()
    want = _weighted_forward(model, edge_index, x, w)
    store = GraphStore.from_edge_index(edge_index, x, edge_weight=w)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)  # self-check on
    assert_full_and_partial(ev, want, torch.tensor(MEDIUM_TARGETS), f"weighted GCNII {project}")
    assert ev.last_stats.batches > ev.num_layers
    unweighted = _weighted_forward(model, edge_index, x, torch.ones_like(w))
    assert (want - unweighted).abs().max() > 1e-2  # the weights change the answer


@examples(20)
@given(case=graphs(), wseed=st.integers(0, 2**16))
def test_edge_weights_random_graphs(case, wseed):
    edge_index, x, targets, reorder = case
    w = _weights(edge_index.shape[1], wseed)
    model = WeightedGCNII().eval()
    want = _weighted_forward(model, edge_index, x, w)
    store = GraphStore.from_edge_index(edge_index, x, edge_weight=w, reorder=reorder)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    assert_full_and_partial(ev, want, targets, "weighted GCNII")


def _sampled_oracle(model, store, x, fanouts, seed):
    """The model with layer ``l``'s conv on ``G_l`` and its edges' weights (external IDs)."""
    topo = store.topology
    nodes = np.arange(store.num_nodes)
    graphs, weights = [], []
    for layer, f in enumerate(fanouts, 1):
        local, pos = sample_in_edges(topo.indptr, nodes, f, layer, seed)
        src = store.to_external(topo.indices[pos].astype(np.int64))
        dst = store.to_external(np.repeat(nodes, np.diff(local)))
        graphs.append(dgl.graph((src, dst), num_nodes=store.num_nodes))
        weights.append(store.edge_weight[torch.from_numpy(pos)])
    with torch.no_grad():
        return model.on_graphs(graphs, x, weights)


@examples(20)
@given(case=sampling.sampled_cases(3), wseed=st.integers(0, 2**16))
def test_edge_weights_sampled(case, wseed):
    """G_l's weighted out-degrees: a source's weights summed over its sampled out-edges."""
    edge_index, x, targets, reorder, fanouts, seed = case
    w = _weights(edge_index.shape[1], wseed)
    model = WeightedGCNII().eval()
    store = GraphStore.from_edge_index(edge_index, x, edge_weight=w, reorder=reorder)
    want = _sampled_oracle(model, store, x, fanouts, seed)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    got = ev.evaluate(fanouts=fanouts, seed=seed)
    assert_exact(got, want, f"sampled weighted GCNII fanouts={fanouts} seed={seed}")
    got = ev.evaluate(targets=targets, fanouts=fanouts, seed=seed)
    assert_exact(got, want[targets], f"sampled weighted GCNII partial fanouts={fanouts}")


def test_edge_weights_sampled_medium_graph(medium_graph):
    edge_index, x, _ = medium_graph
    w = _weights(edge_index.shape[1], 2)
    model = WeightedGCNII().eval()
    store = GraphStore.from_edge_index(edge_index, x, edge_weight=w)
    for fanouts, seed in [([3, 2, 2], 7), ([-1, 1, 4], 0)]:
        want = _sampled_oracle(model, store, x, fanouts, seed)
        ev = LayerwiseEvaluator(model, store, init_batch_nodes=61, progress=False)
        got = ev.evaluate(fanouts=fanouts, seed=seed)
        assert_exact(got, want, f"sampled weighted GCNII fanouts={fanouts}")
        assert ev.last_stats.batches > 2 * ev.num_layers
        whole = _weighted_forward(model, edge_index, x, w)
        assert (got - whole).abs().max() > 1e-3  # G_l's degrees differ from the graph's


def test_non_positive_edge_weights_are_refused():
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    x = torch.randn(3, D_IN)
    w = torch.tensor([1.0, 0.5, 0.0, 2.0])
    store = GraphStore.from_edge_index(edge_index, x, edge_weight=w, reorder=None)
    with pytest.raises(ModelTraceError, match=r"convs\.0.*weight <= 0 \(edge 2 -> 0: 0\.0\)"):
        LayerwiseEvaluator(WeightedGCNII().eval(), store, progress=False)
    with pytest.raises(dgl.DGLError, match="Non-positive edge weight"):  # as DGL's forward
        _weighted_forward(WeightedGCNII().eval(), edge_index, x, w)


def test_edge_features_as_weights_are_refused():
    class EdgeAttr(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GCN2Conv(D_IN, layer=1, allow_zero_in_degree=True)

        def forward(self, g, x, edge_attr):
            return self.conv(g, x, x, edge_weight=edge_attr[:, 0])

    edge_index = torch.tensor([[0, 1], [1, 0]])
    store = GraphStore.from_edge_index(edge_index, torch.randn(2, D_IN), edge_attr=torch.ones(2, 2))
    with pytest.raises(ModelTraceError, match="edge_weight"):
        LayerwiseEvaluator(EdgeAttr().eval(), store, progress=False)
