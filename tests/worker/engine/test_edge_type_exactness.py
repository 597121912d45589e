"""Models taking per-edge relation ids (``forward(x, edge_index, edge_type)``: RGCN,
FastRGCN, RGAT, FiLM with relations, and a relation-typed model mixing them with an
untyped conv) served from the graph store's ``edge_type`` column equal their own
full-graph forward: random graphs with the same ``(src, dst)`` under several relations,
self-loops and isolated nodes, full and partial; a batched medium graph with the load-time
self-check. A model is refused at load on a graph without relation ids (naming the
parameter) or with more relations than its weights cover; the ids matter (shuffled ids
give another result)."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_edge_index
from support.exactness import D_IN, assert_full_and_partial, family_cases, graphs
from torch import nn
from torch_geometric import nn as pyg

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.engine.nodewise import NodewiseEvaluator
from hopserve.worker.trace.tracer import ModelTraceError

R = 4  # relations
H = 8


class TypedTwo(nn.Module):
    """Two convs taking relation ids: ``conv2(relu(conv1(x, t)), t)``, heads flattened."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, edge_index, edge_type):
        h = self.conv1(x, edge_index, edge_type).flatten(1).relu()
        return self.conv2(h, edge_index, edge_type).flatten(1)


class TypedMixed(nn.Module):
    """An RGCN layer, an untyped SAGE layer, an RGCN layer with a residual: typed and
    untyped convs in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg.RGCNConv(D_IN, H, R, num_bases=2)
        self.conv2 = pyg.SAGEConv(H, H)
        self.conv3 = pyg.RGCNConv(H, 4, R, aggr="add")
        self.skip = nn.Linear(D_IN, 4)

    def forward(self, x, edge_index, edge_type):
        h = self.conv1(x, edge_index, edge_type).relu()
        h = self.conv2(h, edge_index).relu()
        return self.conv3(h, edge_index, edge_type) + self.skip(x)


TYPED = {
    "rgcn": lambda: TypedTwo(pyg.RGCNConv(D_IN, H, R), pyg.RGCNConv(H, 4, R)),
    "rgcn_blocks": lambda: TypedTwo(
        pyg.RGCNConv(D_IN, H, R, num_blocks=2), pyg.RGCNConv(H, 4, R, num_blocks=2, aggr="add")
    ),
    "fast_rgcn": lambda: TypedTwo(pyg.FastRGCNConv(D_IN, H, R), pyg.FastRGCNConv(H, 4, R)),
    "rgat": lambda: TypedTwo(pyg.RGATConv(D_IN, H, R), pyg.RGATConv(H, 4, R, heads=2)),
    "film": lambda: TypedTwo(
        pyg.FiLMConv(D_IN, H, num_relations=R), pyg.FiLMConv(H, 4, num_relations=R)
    ),
    "mixed": TypedMixed,
}


def _types(num_edges: int, seed: int) -> torch.Tensor:
    return torch.randint(0, R, (num_edges,), generator=torch.Generator().manual_seed(seed))


def _model(family: str) -> nn.Module:
    torch.manual_seed(0)
    return TYPED[family]().eval()


def _forward(model: nn.Module, x, edge_index, edge_type) -> torch.Tensor:
    with torch.no_grad():
        return model(x, edge_index, edge_type)


def _with_relabelled_duplicates(edge_index: torch.Tensor) -> torch.Tensor:
    """The edges plus a copy of the first few: the same (src, dst) under another relation."""
    return torch.cat([edge_index, edge_index[:, :5]], dim=1)


@family_cases(TYPED, 10, graphs())
def test_random_typed_graphs_equal_forward(family, case):
    edge_index, x, targets, reorder = case
    edge_index = _with_relabelled_duplicates(edge_index)
    et = _types(edge_index.shape[1], seed=int(x.abs().sum() * 1000) % 2**16)
    model = _model(family)
    want = _forward(model, x, edge_index, et)
    store = GraphStore.from_edge_index(edge_index, x, edge_type=et, reorder=reorder)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    assert_full_and_partial(ev, want, targets, family)


@pytest.fixture(scope="module")
def medium():
    ei = random_edge_index(600, 3000, seed=1)
    x = torch.randn(600, D_IN, generator=torch.Generator().manual_seed(2))
    et = _types(ei.shape[1], seed=3)
    return ei, x, et, GraphStore.from_edge_index(ei, x, edge_type=et)


@pytest.mark.parametrize("family", sorted(TYPED))
def test_medium_graph_batched_with_self_check(medium, family):
    ei, x, et, store = medium
    model = _model(family)
    want = _forward(model, x, ei, et)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=37, progress=False)  # self-check on
    assert_exact(ev.evaluate(), want, f"{family} full")
    assert ev.last_stats.batches > ev.num_layers
    targets = torch.tensor([599, 0, 17, 17, 300, 42])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family} partial")


def test_nodewise_fallback_serves_relation_ids(medium):
    ei, x, et, store = medium
    model = _model("rgcn")
    targets = torch.tensor([599, 0, 17, 300])
    got = NodewiseEvaluator(model, store, hops=2).evaluate(targets)
    assert_exact(got, _forward(model, x, ei, et)[targets], "rgcn node-wise")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("resident", [True, False], ids=["graph-on-device", "graph-on-host"])
@pytest.mark.parametrize("family", ["rgcn", "fast_rgcn", "rgat", "mixed"])
def test_cuda_medium_typed_graph(medium, family, resident):
    ei, x, et, store = medium
    model = _model(family)
    want = _forward(model, x, ei, et)  # before .cuda()
    ev = LayerwiseEvaluator(
        model, store, device="cuda", init_batch_nodes=37, graph_on_device=resident,
        progress=False,
    )  # fmt: skip
    assert_full_and_partial(ev, want, torch.tensor([599, 0, 17, 300]), family, " on cuda")


def test_the_relation_ids_matter(medium):
    """The test can fail: served rows are those of the forward with the graph's ids, far
    from the forward with the ids shuffled over the edges or all one relation."""
    ei, x, et, store = medium
    model = _model("rgcn")
    got = LayerwiseEvaluator(model, store, progress=False).evaluate()
    assert_exact(got, _forward(model, x, ei, et), "rgcn")
    shuffled = et[torch.randperm(et.numel(), generator=torch.Generator().manual_seed(0))]
    for other in (shuffled, torch.zeros_like(et)):
        far = (got - _forward(model, x, ei, other)).abs().max().item()
        assert far > 1e-2, f"the relation ids changed nothing ({far})"


def test_a_graph_without_relation_ids_is_refused_naming_the_parameter(medium):
    ei, x, _, _ = medium
    with pytest.raises(ModelTraceError, match=r"edge data 'edge_type'.*\(edge_type\)"):
        LayerwiseEvaluator(_model("rgcn"), GraphStore.from_edge_index(ei, x), progress=False)


def test_more_relations_than_the_model_has_weights_for_is_refused(medium):
    ei, x, et, _ = medium
    store = GraphStore.from_edge_index(ei, x, edge_type=et.clamp(max=1) + 4)  # ids up to 5
    with pytest.raises(ModelTraceError, match=f"graph has 6 relations.*has weights for {R}"):
        LayerwiseEvaluator(_model("rgcn"), store, progress=False)
