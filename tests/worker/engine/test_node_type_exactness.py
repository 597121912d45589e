"""Models taking per-node type ids (``forward(x, edge_index, node_type, edge_type,
edge_attr)``: PyG's ``HEATConv``) served from a typed store (node type ids from its node
types, relation ids and edge features from its edge columns) equal their own full-graph
forward: random typed graphs (types in runs of storage ids, reordered within each type,
empty types, self-loops, duplicate edges), full and partial; a batched medium graph with
the load-time self-check; the node-wise fallback. An untyped store, or one with more node
types than the model's weights cover, is refused naming why; the ids matter."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_exact, random_edge_index
from support.exactness import D_IN, assert_full_and_partial, graphs
from torch import nn
from torch_geometric import nn as pyg

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.engine.nodewise import NodewiseEvaluator
from hopserve.worker.graph.node_types import NodeTypeInfo
from hopserve.worker.trace.tracer import ModelTraceError

T, R, D_E = 3, 4, 2  # node types, relations, edge feature width


class HEAT(nn.Module):
    """Two ``HEATConv`` layers (per-type input maps, relation and edge-feature attention)."""

    def __init__(self, num_node_types: int = T) -> None:
        super().__init__()
        kw = {"num_node_types": num_node_types, "num_edge_types": R, "edge_type_emb_dim": 3}
        kw |= {"edge_dim": D_E, "edge_attr_emb_dim": 3}
        self.conv1 = pyg.HEATConv(D_IN, 8, heads=2, **kw)
        self.conv2 = pyg.HEATConv(16, 4, heads=2, concat=False, **kw)

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        h = self.conv1(x, edge_index, node_type, edge_type, edge_attr).relu()
        return self.conv2(h, edge_index, node_type, edge_type, edge_attr)


def typed(n: int, counts: list[int], edge_index: torch.Tensor, seed: int):
    """``(node_type [n], edge_type [E], edge_attr [E, D_E], store kwargs)``: types in runs
    of ``counts`` (input ids), random relations and edge features."""
    gen = torch.Generator().manual_seed(seed)
    node_type = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    e = edge_index.shape[1]
    edge_type = torch.randint(0, R, (e,), generator=gen)
    edge_attr = torch.randn(e, D_E, generator=gen)
    offsets = [0, *torch.tensor(counts).cumsum(0).tolist()]
    types = [
        NodeTypeInfo(name=f"t{k}", offset=offsets[k], count=c, feature_dim=D_IN)
        for k, c in enumerate(counts)
    ]
    relations = [f"t0__r{k}__t0" for k in range(R)]
    kw = {"node_types": types, "edge_type": edge_type, "relations": relations}
    return node_type, edge_type, edge_attr, kw | {"edge_attr": edge_attr}


def _forward(model, x, edge_index, *typed_inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(x, edge_index, *typed_inputs)


@settings(max_examples=10, deadline=None)
@given(case=graphs(), cuts=st.lists(st.integers(0, 40), min_size=2, max_size=2))
def test_random_typed_graphs_equal_forward(case, cuts):
    edge_index, x, targets, reorder = case
    n = x.shape[0]
    a, b = sorted(min(c, n) for c in cuts)
    counts = [a, b - a, n - b]  # some types empty
    node_type, edge_type, edge_attr, kw = typed(n, counts, edge_index, seed=n)
    torch.manual_seed(0)
    model = HEAT().eval()
    want = _forward(model, x, edge_index, node_type, edge_type, edge_attr)
    store = GraphStore.from_edge_index(edge_index, x, reorder=reorder, **kw)
    assert torch.equal(store.node_type_ids, node_type[store.to_external(torch.arange(n))])
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    assert_full_and_partial(ev, want, targets, "heat")


@pytest.fixture(scope="module")
def medium():
    n = 500
    ei = random_edge_index(n, 2500, seed=1)
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(2))
    node_type, edge_type, edge_attr, kw = typed(n, [200, 250, 50], ei, seed=3)
    store = GraphStore.from_edge_index(ei, x, **kw)
    return ei, x, (node_type, edge_type, edge_attr), store


def test_medium_graph_batched_with_self_check(medium):
    ei, x, inputs, store = medium
    torch.manual_seed(0)
    model = HEAT().eval()
    want = _forward(model, x, ei, *inputs)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=37, progress=False)  # self-check on
    assert_exact(ev.evaluate(), want, "heat full")
    assert ev.last_stats.batches > ev.num_layers
    targets = torch.tensor([499, 0, 17, 17, 300, 460])
    assert_exact(ev.evaluate(targets=targets), want[targets], "heat partial")
    node_type, edge_type, edge_attr = inputs
    other = _forward(model, x, ei, (node_type + 1) % T, edge_type, edge_attr)
    assert (other - want).abs().max() > 1e-2  # the test can fail: the types matter


def test_nodewise_fallback_serves_node_type_ids(medium):
    ei, x, inputs, store = medium
    torch.manual_seed(0)
    model = HEAT().eval()
    targets = torch.tensor([499, 0, 17, 300, 460])
    got = NodewiseEvaluator(model, store, hops=2).evaluate(targets)
    assert_exact(got, _forward(model, x, ei, *inputs)[targets], "heat node-wise")


def test_an_untyped_store_is_refused_naming_the_parameter(medium):
    ei, x, (_, edge_type, edge_attr), _ = medium
    store = GraphStore.from_edge_index(ei, x, edge_type=edge_type, edge_attr=edge_attr)
    with pytest.raises(ModelTraceError, match="node type ids 'node_type'.*untyped"):
        LayerwiseEvaluator(HEAT().eval(), store, progress=False)


def test_more_node_types_than_the_model_has_weights_for_is_refused(medium):
    *_, store = medium
    with pytest.raises(ModelTraceError, match="graph has 3 node types.*has weights for 2"):
        LayerwiseEvaluator(HEAT(num_node_types=2).eval(), store, progress=False)


def _hetero_data(seed: int, with_weight: bool = False):
    """A ``HeteroData`` of three types (one width) whose relations all carry ``edge_attr``."""
    from torch_geometric.data import HeteroData

    gen = torch.Generator().manual_seed(seed)
    counts = {"account": 30, "device": 12, "merchant": 9}
    data = HeteroData()
    for t, n in counts.items():
        data[t].x = torch.randn(n, D_IN, generator=gen)
    for s, r, d in [("account", "uses", "device"), ("device", "used-by", "account"),
                    ("account", "pays", "merchant"), ("merchant", "paid-by", "account")]:  # fmt: skip
        e = 60
        data[s, r, d].edge_index = torch.stack(
            [
                torch.randint(0, counts[s], (e,), generator=gen),
                torch.randint(0, counts[d], (e,), generator=gen),
            ]  # fmt: skip
        )
        data[s, r, d].edge_attr = torch.randn(e, D_E, generator=gen)
        if with_weight:
            data[s, r, d].edge_weight = torch.rand(e, generator=gen) + 0.5
    return data


def test_heterodata_with_per_relation_edge_attr_equals_to_homogeneous_forward():
    """``from_pyg(HeteroData)`` takes each relation's ``edge_attr`` into the store's edge
    column: a homogeneous-form model over node types, relations and edge features equals
    its forward on ``HeteroData.to_homogeneous()``."""
    data = _hetero_data(0)
    store = GraphStore.from_pyg(data)
    assert store.edge_features is not None and store.edge_features.shape[1] == D_E
    homo = data.to_homogeneous()
    torch.manual_seed(0)
    model = HEAT().eval()
    want = _forward(model, homo.x, homo.edge_index, homo.node_type, homo.edge_type, homo.edge_attr)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=7, progress=False)
    targets = torch.tensor([0, 29, 30, 41, 50, 5, 5])
    assert_full_and_partial(ev, want, targets, "heat from HeteroData")
    assert GraphStore.from_pyg(data, edge_data=False).edge_features is None


def test_per_relation_edge_data_must_cover_every_relation_in_one_width():
    data = _hetero_data(1, with_weight=True)
    assert GraphStore.from_pyg(data).edge_weight is not None
    del data["merchant", "paid-by", "account"].edge_attr
    with pytest.raises(
        ValueError,
        match=r"edge_attr_dict has no rows for relation \('merchant', 'paid-by', 'account'\)",
    ):
        GraphStore.from_pyg(data)
    data["merchant", "paid-by", "account"].edge_attr = torch.randn(60, D_E + 1)
    with pytest.raises(
        ValueError,
        match=r"edge_attr_dict\[\('merchant', 'paid-by', 'account'\)\] has shape \[60, 3\], expected \[60, 2\]",
    ):
        GraphStore.from_pyg(data)
