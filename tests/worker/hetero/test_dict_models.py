"""Dict models (``forward(x_dict, edge_index_dict)``: ``HeteroConv`` stacks and PyG's
``to_hetero``) served layer by layer from a typed store equal their own forward per node
type, full and partial, on ``FakeHeteroDataset`` graphs and random typed graphs
(hypothesis: empty types, types without in-edges, same-type relations, duplicate edges,
isolated nodes), in batches of 3 nodes. Ops mixing types, relation convs needing a
whole-graph statistic and dict models on untyped stores are refused naming the cause."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import assert_exact, spy_relation_slices
from torch import nn
from torch_geometric import nn as pyg
from torch_geometric.data import HeteroData

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.convs import edge_chunks
from hopserve.worker.convs.hgt import HGTAdapter
from hopserve.worker.trace.tracer import ModelTraceError

H = 8


def _relation_conv(k: int, same_type: bool) -> nn.Module:
    """A family per relation: SAGE, GAT, GraphConv, GATv2 (square on same-type ones)."""
    size = -1 if same_type else (-1, -1)
    return [
        lambda: pyg.SAGEConv(size, H),
        lambda: pyg.GATConv(size, H, heads=2, concat=False, add_self_loops=False),
        lambda: pyg.GraphConv(size, H, aggr="mean"),
        lambda: pyg.GATv2Conv(size, H, add_self_loops=same_type),
    ][k % 4]()


class HeteroStack(nn.Module):
    """Two ``HeteroConv`` layers, relu between (one op per type), a linear head on one type."""

    def __init__(self, metadata, aggr: str, head_type: str) -> None:
        super().__init__()
        self.head_type = head_type
        self.convs = nn.ModuleList(
            pyg.HeteroConv(
                {et: _relation_conv(k + i, et[0] == et[2]) for k, et in enumerate(metadata[1])},
                aggr=aggr,
            )
            for i in range(2)
        )
        self.head = pyg.Linear(-1, 3)

    def forward(self, x_dict, edge_index_dict):
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
            x_dict = {k: F.relu(v) for k, v in x_dict.items()}
        return self.head(x_dict[self.head_type])


class ProjectedHetero(nn.Module):
    """Per-type input projections (``torch.nn.Linear`` each), one ``HeteroConv``, a per-type
    residual, every type's embeddings out (a dict)."""

    def __init__(self, data: HeteroData) -> None:
        super().__init__()
        self.proj = nn.ModuleDict({t: nn.Linear(data[t].x.shape[1], H) for t in data.node_types})
        self.conv = pyg.HeteroConv({et: pyg.SAGEConv(H, H) for et in data.edge_types}, aggr="mean")

    def forward(self, x_dict, edge_index_dict):
        h = {t: self.proj[t](x).tanh() for t, x in x_dict.items()}
        out = self.conv(h, edge_index_dict)
        return {t: out[t] + 0.5 * h[t] for t in out}


class HGT(nn.Module):
    """Per-type input projections, two ``HGTConv`` layers (typed attention over every
    in-relation of a node), every type's embeddings out. The first layer keeps the width
    (its skip gate mixes in the input), the second widens (no skip) unless ``out`` is H."""

    def __init__(self, metadata, out: int = H, conv: type = pyg.HGTConv) -> None:
        super().__init__()
        self.proj = nn.ModuleDict({t: pyg.Linear(-1, H) for t in metadata[0]})
        self.convs = nn.ModuleList([conv(H, H, metadata, heads=2), conv(H, out, metadata, heads=2)])

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.proj[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = {t: x for t, x in conv(x_dict, edge_index_dict).items() if x is not None}
        return x_dict


class Skip(nn.Module):
    """The homogeneous model ``to_hetero`` rewrites: SAGE with a linear skip, then SAGE."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg.SAGEConv((-1, -1), H)
        self.lin1 = pyg.Linear(-1, H)
        self.conv2 = pyg.SAGEConv((-1, -1), 4)

    def forward(self, x, edge_index):
        h = (self.conv1(x, edge_index) + self.lin1(x)).relu()
        return self.conv2(h, edge_index)


FAMILIES = [
    *(f"heteroconv_{aggr}" for aggr in ("sum", "mean", "max", "cat")),
    "projected",
    "hgt",
    *(f"to_hetero_{aggr}" for aggr in ("sum", "mean", "max")),
]


def _model(family: str, data: HeteroData) -> nn.Module:
    md = data.metadata()
    kind, _, aggr = family.rpartition("_")
    if kind == "heteroconv":
        return HeteroStack(md, aggr, md[1][0][2])
    if kind == "to_hetero":
        return pyg.to_hetero(Skip(), md, aggr=aggr)
    if family == "hgt":
        return HGT(md)
    assert family == "projected"
    return ProjectedHetero(data)


def _forward(model: nn.Module, data: HeteroData):
    with torch.no_grad():
        return model(data.x_dict, data.edge_index_dict)


def _by_type(out, data: HeteroData, model: nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(out, dict):
        return out
    return {model.head_type: out}


def check_dict_model(model: nn.Module, data: HeteroData, what: str, seed: int = 0) -> None:
    """Every output type's rows, all and a partial set with duplicates and several types."""
    torch.manual_seed(seed)
    _forward(model, data)  # initialize lazy shapes
    model.eval()
    want = _by_type(_forward(model, data), data, model)
    store = GraphStore.from_pyg(data)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, progress=False)
    offsets = {t.name: t.offset for t in store.node_types}
    full = ev.evaluate()
    assert set(ev.output_types) == set(want)
    for t in store.node_types:  # rows of types the model does not output are zero
        if t.name not in want and t.count:
            assert not full[t.offset : t.offset + t.count].any(), t.name
            with pytest.raises(ValueError, match=f"other types \\(IDs \\[{t.offset}\\]"):
                ev.evaluate(targets=[t.offset])
    gen = torch.Generator().manual_seed(seed)
    targets, rows = [], []
    for t, rows_t in want.items():
        ids = torch.arange(rows_t.shape[0])
        assert_exact(full[offsets[t] + ids], rows_t, f"{what} full, type {t}")
        pick = ids[torch.randperm(ids.numel(), generator=gen)[:3]]
        targets.append(offsets[t] + torch.cat([pick, pick[:1]]))
        rows.append(rows_t[torch.cat([pick, pick[:1]])])
    targets = torch.cat(targets)
    if targets.numel():
        assert_exact(ev.evaluate(targets=targets), torch.cat(rows), f"{what} partial")


def _fake(seed: int) -> HeteroData:
    """A ``FakeHeteroDataset`` graph (seeded: it draws sizes from ``random``) in which every
    node type has in-edges (``to_hetero`` models need that)."""
    from torch_geometric.datasets import FakeHeteroDataset

    for attempt in range(100):
        random.seed(seed + attempt)
        torch.manual_seed(seed + attempt)
        data = FakeHeteroDataset(num_graphs=1, num_node_types=3, num_edge_types=6,
                                 avg_num_nodes=30, avg_degree=4, num_classes=3)[0]  # fmt: skip
        if {et[2] for et in data.edge_types} == set(data.node_types):
            return data
    raise AssertionError("no FakeHeteroDataset graph with in-edges for every type")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_dict_models_equal_their_forward_on_fake_hetero_data(family, seed):
    data = _fake(seed)
    torch.manual_seed(seed)
    check_dict_model(_model(family, data), data, family, seed)


@st.composite
def typed_graphs(draw) -> HeteroData:
    """2-3 node types (0-9 nodes, widths 1-5), 1-5 relations (same-type ones included),
    0-25 edges each with duplicates; some types have no in-edges."""
    num_types = draw(st.integers(2, 3))
    counts = draw(st.lists(st.integers(0, 9), min_size=num_types, max_size=num_types))
    widths = draw(st.lists(st.integers(1, 5), min_size=num_types, max_size=num_types))
    names = [f"t{k}" for k in range(num_types)]
    pairs = draw(
        st.lists(
            st.tuples(st.integers(0, num_types - 1), st.integers(0, num_types - 1)),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    seed = draw(st.integers(0, 10_000))
    gen = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for name, n, w in zip(names, counts, widths, strict=True):
        data[name].x = torch.randn(n, w, generator=gen)
    for k, (s, d) in enumerate(pairs):
        e = draw(st.integers(0, 25)) if counts[s] and counts[d] else 0
        src = torch.randint(0, max(counts[s], 1), (e,), generator=gen)
        dst = torch.randint(0, max(counts[d], 1), (e,), generator=gen)
        if e:
            src, dst = torch.cat([src, src[:2]]), torch.cat([dst, dst[:2]])  # duplicates
        data[names[s], f"r{k}", names[d]].edge_index = torch.stack([src, dst])
    return data


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=typed_graphs(), aggr=st.sampled_from(["sum", "mean", "max", "cat"]))
def test_heteroconv_equals_its_forward_on_random_typed_graphs(data, aggr):
    torch.manual_seed(0)
    model = HeteroStack(data.metadata(), aggr, data.edge_types[0][2])
    try:
        _forward(model, data)
    except (AttributeError, KeyError, RuntimeError):
        # The model's own forward fails (a type the second layer reads has no in-relation
        # in the first): nothing to serve. hopserve must refuse it the same way.
        with pytest.raises(ModelTraceError):
            LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
        return
    check_dict_model(model, data, f"HeteroConv aggr={aggr}")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=typed_graphs(), out=st.sampled_from([H, 2 * H]))
def test_hgt_equals_its_forward_on_random_typed_graphs(data, out):
    md = data.metadata()
    assume({et[2] for et in md[1]} == set(md[0]))  # a second HGT layer reads every type
    torch.manual_seed(0)
    check_dict_model(HGT(md, out), data, f"HGT out={out}")


class OwnHGTConv(pyg.HGTConv):
    """A user's ``HGTConv`` with its own ``forward`` (here: the parent's, doubled)."""

    def forward(self, x_dict, edge_index_dict):
        out = super().forward(x_dict, edge_index_dict)
        return {t: None if v is None else 2 * v for t, v in out.items()}


def test_hgt_runs_on_the_destination_side_adapter(monkeypatch):
    """``HGTConv`` runs on :class:`HGTAdapter` (keys and values once per gathered source
    row, the relation maps on the destination side), with no whole-layer table; exact with
    its edges scored and summed one edge per chunk too (every chunk boundary crossed)."""
    data = _fake(0)
    model = HGT(data.metadata(), 2 * H)
    check_dict_model(model, data, "HGT")
    ev = LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
    assert {type(a) for a in ev.split.adapters.values()} == {HGTAdapter}
    assert not any(a.supports_global_src for a in ev.split.adapters.values())
    monkeypatch.setattr(edge_chunks, "EDGE_CHUNK_BYTES", 1)
    check_dict_model(model, data, "HGT, one edge per chunk")


def test_hgt_projects_a_hubs_keys_and_values_per_chunk_of_edges(monkeypatch):
    """A batch whose ``[k | v]`` table would outgrow ``KV_TABLE_BYTES`` (a hub's sources)
    projects each chunk of edges' sources instead: no table, the same rows, with chunks of
    many edges (rows of several types in one chunk) or of one."""
    import hopserve.worker.convs.hgt as hgt

    data = _fake(1)
    model = HGT(data.metadata(), 2 * H)
    calls = []  # (rows, parts) of key/value projections: tables take two parts, chunks one
    projected = hgt.HGTAdapter._projected

    def spy(self, x, rows, parts):
        if parts[0].start == 0:  # keys (and values); the queries' part starts at F
            calls.append((x.shape[0], len(parts)))
        return projected(self, x, rows, parts)

    monkeypatch.setattr(hgt.HGTAdapter, "_projected", spy)
    check_dict_model(model, data, "HGT, [k | v] tables")
    assert any(parts == 2 for _, parts in calls)
    monkeypatch.setattr(edge_chunks, "KV_TABLE_BYTES", 0)
    calls.clear()
    check_dict_model(model, data, "HGT, keys and values per chunk")
    assert all(parts == 1 for _, parts in calls) and max(rows for rows, _ in calls) > 1
    monkeypatch.setattr(edge_chunks, "EDGE_CHUNK_BYTES", 1)
    calls.clear()
    check_dict_model(model, data, "HGT, keys and values per edge")
    assert calls and all(rows == 1 for rows, _ in calls)  # one source row a call


def test_an_hgtconv_subclass_with_its_own_forward_is_refused_naming_it():
    data = _fake(0)
    assert_refused(HGT(data.metadata(), H, OwnHGTConv), data, "OwnHGTConv.*takes per-type dicts")


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=typed_graphs(), aggr=st.sampled_from(["sum", "mean", "max"]))
def test_to_hetero_equals_its_forward_on_random_typed_graphs(data, aggr):
    md = data.metadata()
    assume({et[2] for et in md[1]} == set(md[0]))  # to_hetero needs every type updated
    torch.manual_seed(0)
    model = pyg.to_hetero(Skip(), md, aggr=aggr)
    check_dict_model(model, data, f"to_hetero aggr={aggr}")


class OneConv(nn.Module):
    """A dict model of one dict conv, ``conv(x_dict, edge_index_dict)``, then ``then`` (a
    function of the output dict) when given."""

    def __init__(self, conv: nn.Module, then=None) -> None:  # noqa: ANN001 - a callable
        super().__init__()
        self.conv, self.then = conv, then

    def forward(self, x_dict, edge_index_dict):
        out = self.conv(x_dict, edge_index_dict)
        return out if self.then is None else self.then(out)


def assert_refused(model: nn.Module, data: HeteroData, match: str) -> None:
    """The model runs on ``data`` itself, and hopserve refuses it at load, saying ``match``."""
    _forward(model, data)
    with pytest.raises(ModelTraceError, match=match):
        LayerwiseEvaluator(model.eval(), GraphStore.from_pyg(data), progress=False)


def test_mixing_two_types_is_refused_naming_the_op():
    data = _fake(0)
    a, b = data.node_types[:2]
    conv = pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in data.edge_types})
    model = OneConv(conv, then=lambda out: out[a][:3] + out[b][:3])
    assert_refused(model, data, rf"mixes the values of node types \['{a}', '{b}'\]")


def test_a_relation_conv_needing_degrees_is_refused_naming_it():
    data = _fake(0)
    same = next(et for et in data.edge_types if et[0] == et[2])
    model = OneConv(pyg.HeteroConv({same: pyg.GCNConv(-1, H)}))
    assert_refused(model, data, "GCNConv.*whole-graph statistic")


def test_a_dict_model_on_an_untyped_store_is_refused():
    data = _fake(0)
    model = HeteroStack(data.metadata(), "sum", data.edge_types[0][2])
    store = GraphStore.from_edge_index(torch.tensor([[0, 1], [1, 0]]), torch.randn(2, 4))
    with pytest.raises(
        ModelTraceError, match="takes per-type dicts, but the graph has no node types"
    ):
        LayerwiseEvaluator(model.eval(), store, progress=False)


def test_optional_edge_data_the_store_lacks_is_refused_not_left_out():
    """A dict model whose forward takes per-relation edge weights (even with a default)
    is never served without them: a store without edge weights is refused naming it."""
    data = _fake(0)

    class WithEdgeAttr(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in data.edge_types})

        def forward(self, x_dict, edge_index_dict, edge_weight_dict=None):
            weights = {} if edge_weight_dict is None else edge_weight_dict
            return self.conv(x_dict, edge_index_dict, edge_weight_dict=weights)

    assert_refused(WithEdgeAttr(), data, r"edge data 'edge_weight_dict'.*\(edge_weight\)")


def test_han_is_refused_naming_its_global_attention():
    data = _fake(0)
    model = OneConv(pyg.HANConv(-1, H, data.metadata()))
    assert_refused(model, data, "HANConv.*averages a score over every node")


# --------------------------------------------------------------------------- to_hetero joins
def _convs_per_layer(ev: LayerwiseEvaluator) -> list[int]:
    return [len(block.convs) for block in ev.split.blocks if block.convs]


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
def test_to_hetero_layer_is_one_typed_layer(aggr):
    """A ``to_hetero`` layer's relation convs and their joins run as one HeteroLayer (one
    table and one pass over a batch's edges per layer, not one per relation), exact."""
    data = _fake(0)
    model = pyg.to_hetero(Skip(), data.metadata(), aggr=aggr)
    check_dict_model(model, data, f"to_hetero {aggr}")
    ev = LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
    assert _convs_per_layer(ev) == [1, 1]
    layers = [a.conv for a in ev.split.adapters.values()]
    assert [len(m.calls) for m in layers] == [len(data.edge_types)] * 2
    assert {m.aggr for m in layers} == {aggr}


def test_to_hetero_relation_output_read_twice_runs_per_relation():
    """A relation conv's output read outside its type's join (edited into the graph here):
    that layer runs relation by relation, as written, and stays exact."""
    import operator

    data = _fake(1)
    model = pyg.to_hetero(Skip(), data.metadata(), aggr="sum")
    graph = model.graph
    join = next(n for n in graph.nodes if n.target is torch.add and n.name.startswith("conv1"))
    leaf = join.args[0]
    with graph.inserting_after(join):
        half = graph.call_function(operator.mul, (leaf, 0.5))
    with graph.inserting_after(half):
        extra = graph.call_function(operator.add, (join, half))
    join.replace_all_uses_with(extra, delete_user_cb=lambda user: user is not extra)
    model.recompile()
    check_dict_model(model, data, "to_hetero, a relation output read twice")
    ev = LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
    first, second = _convs_per_layer(ev)
    assert first == len(data.edge_types) and second == 1


def test_raw_source_relation_convs_read_the_stored_table_in_place(monkeypatch):
    """``to_hetero`` SAGE (no projection: it aggregates raw source rows) reads each
    layer's stored table in place, relation by relation (sum / mean by one SpMM), each
    relation's edges of a full layer's batch a slice of the store's per-relation CSC, exact
    on graphs whose types have different widths (a narrower type's rows gathered)."""
    from hopserve.worker.convs.hetero import HeteroLayerAdapter

    calls, slices = [], spy_relation_slices(monkeypatch)
    original = HeteroLayerAdapter._relation_in_place

    def spy(layer, k, x, x_dst, src, dst, indptr):
        calls.append(layer.in_widths[layer.calls[k].src] == x.shape[1])
        return original(layer, k, x, x_dst, src, dst, indptr)

    monkeypatch.setattr(HeteroLayerAdapter, "_relation_in_place", staticmethod(spy))
    for aggr in ("sum", "mean", "max"):
        data = _fake(2)
        check_dict_model(pyg.to_hetero(Skip(), data.metadata(), aggr=aggr), data, aggr)
    assert any(calls) and not all(calls), "both the in-place and the narrower-type path"
    assert len({start for _, start, _ in slices}) > 5, "full layers' batches: slices"
    ev = LayerwiseEvaluator(
        pyg.to_hetero(Skip(), data.metadata()), GraphStore.from_pyg(data), progress=False
    )
    ev.evaluate()
    assert all(ly.gather_free for ly in ev.last_stats.layers if ly.layer > 0)


@pytest.mark.parametrize("num_relations", [42, 67])
def test_a_model_of_many_relations_equals_its_forward(num_relations, monkeypatch):
    """With many relations the load-time probe graph (random relation ids) may lack the
    last ones: its batches scan their relation ids, the store's read the store's
    per-relation CSC (review finding: slicing the probe's index by the layer's ids raised
    IndexError at load for 42 and 67 relations)."""
    slices = spy_relation_slices(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    n = {"a": 50, "b": 30}
    data = HeteroData()
    for t, count in n.items():
        data[t].x = torch.randn(count, 6, generator=gen)
    relations = [("a", f"r{k}", "a" if k % 2 else "b") for k in range(num_relations - 1)]
    for s, r, d in [*relations, ("b", "back", "a")]:
        ends = [torch.randint(0, n[t], (30,), generator=gen) for t in (s, d)]
        data[s, r, d].edge_index = torch.stack(ends)
    check_dict_model(pyg.to_hetero(Skip(), data.metadata(), aggr="sum"), data, "many")
    assert {relation for relation, _, _ in slices} >= {0, num_relations - 1}


class SharedModulesPerType(nn.Module):
    """One dropout and one activation module applied to every type's value, a per-type
    ``Linear`` on one type, then ``HeteroConv``: the shared modules are one op over the
    table (not one per type), the per-type ``Linear`` a ``TypedRows``."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in metadata[1]}, aggr="sum")
            for _ in range(2)
        )
        self.act, self.drop = nn.ELU(), nn.Dropout(0.4)
        self.lin = nn.Linear(H, H)

    def forward(self, x_dict, edge_index_dict):
        h = self.convs[0](x_dict, edge_index_dict)
        h = {t: self.drop(self.act(v)) for t, v in h.items()}
        t0 = sorted(h)[0]
        h = {t: self.lin(v) if t == t0 else v for t, v in h.items()}
        return self.convs[1](h, edge_index_dict)


def test_shared_elementwise_modules_are_one_op_over_the_table():
    from hopserve.worker.hetero.modules import TypedRows

    data = _fake(3)
    model = SharedModulesPerType(data.metadata())
    check_dict_model(model, data, "shared modules")
    ev = LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
    typed = [m.module for m in ev.model.modules() if isinstance(m, TypedRows)]
    assert typed == [model.lin], "only the per-type Linear runs on one type's rows"


class ActDrop(nn.Module):
    """SAGE, ReLU and Dropout modules, SAGE: ``to_hetero`` copies each module per type."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = pyg.SAGEConv((-1, -1), H), pyg.SAGEConv((-1, -1), 4)
        self.act, self.drop = nn.ReLU(), nn.Dropout(0.2)

    def forward(self, x, edge_index):
        return self.conv2(self.drop(self.act(self.conv1(x, edge_index))), edge_index)


def test_per_type_copies_of_an_elementwise_module_are_one_op():
    """``to_hetero``'s per-type copies of ``ReLU`` and ``Dropout`` are one op each over
    the layer's table (not three, and no merge of three tables for the next layer)."""
    from hopserve.worker.hetero.modules import TypedMerge

    data = _fake(5)
    model = pyg.to_hetero(ActDrop(), data.metadata())
    check_dict_model(model, data, "to_hetero copies")
    ev = LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
    called = [str(n.target) for n in ev.model.graph.nodes if n.op == "call_module"]
    assert sum(".act." in c for c in called) == 1 and sum(".drop." in c for c in called) == 1
    assert not any(isinstance(m, TypedMerge) for m in ev.model.modules())


class InPlaceOnSomeTypes(nn.Module):
    """In-place activations on some types' values of a ``HeteroConv`` output (one table
    for every type): a module, a function with ``inplace=True`` by keyword and by position,
    a ``relu_`` method, and a value read again after its in-place update."""

    def __init__(self, metadata, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.convs = nn.ModuleList(
            pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in metadata[1]}, aggr="sum")
            for _ in range(2)
        )
        self.act = nn.LeakyReLU(0.2, inplace=True)

    def _in_place(self, v):
        if self.kind == "module":
            return self.act(v)
        if self.kind == "keyword":
            return F.leaky_relu(v, 0.2, inplace=True)
        if self.kind == "position":
            return F.leaky_relu(v, 0.2, True)
        if self.kind == "function_":
            return torch.relu_(v)
        return v.relu_()

    def forward(self, x_dict, edge_index_dict):
        h = self.convs[0](x_dict, edge_index_dict)
        t0 = sorted(h)[0]
        y = {t: self._in_place(v) if t == t0 else v for t, v in h.items()}
        h = {t: y[t] + h[t] for t in h}  # h[t0] is y[t0]: read after its update
        return self.convs[1](h, edge_index_dict)


@pytest.mark.parametrize("kind", ["module", "keyword", "position", "method", "function_"])
def test_an_in_place_op_on_one_types_value_leaves_the_other_types_alone(kind):
    """The conv's output is one table for every type: an in-place op on one type's value
    runs out of place there (review finding: a shared in-place module changed the other
    types' rows, up to 4.2 off), and that type's value reads the result afterwards."""
    data = _fake(4)
    check_dict_model(InPlaceOnSomeTypes(data.metadata(), kind), data, f"in place: {kind}")


class TorchAddSkip(nn.Module):
    """``torch.add(conv(x), lin(x))``: ``to_hetero`` keeps ``torch.add`` for the skip, the
    op it joins relations with too; the skip is not part of the relations' join."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = pyg.SAGEConv((-1, -1), H)
        self.lin = pyg.Linear(-1, H)

    def forward(self, x, edge_index):
        return torch.add(self.conv(x, edge_index), self.lin(x)).relu()


def test_to_hetero_join_stops_below_a_residual_torch_add():
    data = _fake(0)
    model = pyg.to_hetero(TorchAddSkip(), data.metadata(), aggr="sum")
    check_dict_model(model, data, "to_hetero, torch.add skip")
    ev = LayerwiseEvaluator(model, GraphStore.from_pyg(data), progress=False)
    assert _convs_per_layer(ev) == [1]


class WritesOut(nn.Module):
    """``torch.add(a, 1, out=a)`` on one type's value, then the same in-place call twice
    on a value of no type (two identical calls: both count)."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.conv = pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in metadata[1]})
        self.w = nn.Parameter(torch.randn(H))

    def forward(self, x_dict, edge_index_dict):
        h = self.conv(x_dict, edge_index_dict)
        t0 = sorted(h)[0]
        torch.add(h[t0], 1.0, out=h[t0])
        c = self.w * 1.0
        c.add_(1.0)
        c.add_(1.0)
        return {t: v + c for t, v in h.items()}


def test_writes_through_out_and_repeated_in_place_calls_are_kept():
    """Review findings: ``out=`` wrote into the table every type shares, and two identical
    in-place calls on an untyped value were merged into one."""
    data = _fake(7)
    check_dict_model(WritesOut(data.metadata()), data, "out= and repeated in-place calls")


class InPlaceModuleTwice(nn.Module):
    """An in-place module (``ELU(inplace=True)``: not idempotent) applied twice to a value
    of no type, its results discarded; and the same value computed twice beside it."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.conv = pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in metadata[1]})
        self.w = nn.Parameter(torch.randn(H))
        self.act = nn.ELU(inplace=True)

    def forward(self, x_dict, edge_index_dict):
        h = self.conv(x_dict, edge_index_dict)
        c = self.w - 1.0
        same = self.w - 1.0  # an identical call: one op in the rebuild
        self.act(c)
        self.act(c)
        return {t: v + c * 2.0 + same for t, v in h.items()}


def test_an_in_place_module_on_an_untyped_value_counts_each_call():
    """Read-through finding: the two calls were one op (ELU once), and the write went into
    the op ``same`` was merged with."""
    data = _fake(8)
    check_dict_model(InPlaceModuleTwice(data.metadata()), data, "in-place module twice")


class WritesOneType(nn.Module):
    """A write into one type's value the rebuild cannot run out of place: ``zero_()`` (no
    out-of-place form), or ``relu_()`` into a view of the value."""

    def __init__(self, metadata, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.conv = pyg.HeteroConv({et: pyg.SAGEConv((-1, -1), H) for et in metadata[1]})
        self.act = nn.ReLU(inplace=True)
        self.w = nn.Parameter(torch.randn(H))

    def forward(self, x_dict, edge_index_dict):
        h = self.conv(x_dict, edge_index_dict)
        t0 = sorted(h)[0]
        if self.kind == "view":
            h[t0][:, :2].relu_()
            return h
        if self.kind == "module into a view":  # of a value of no type
            c = self.w - 1.0
            self.act(c[:4])
            return {t: v + c for t, v in h.items()}
        return {t: v.zero_() if t == t0 else v for t, v in h.items()}


@pytest.mark.parametrize(
    ("kind", "seed", "match"),
    [
        ("no out-of-place form", 6, r"zero_ writes one node type's value in place"),
        ("view", 8, r"writes in place into a view of a value"),
        ("module into a view", 9, r"writes in place into a view of a value"),
    ],
)
def test_a_write_the_rebuild_cannot_run_out_of_place_is_refused_naming_it(kind, seed, match):
    data = _fake(seed)
    model = WritesOneType(data.metadata(), kind)
    _forward(model, data)
    with pytest.raises(ModelTraceError, match=match):
        LayerwiseEvaluator(model.eval(), GraphStore.from_pyg(data), progress=False)
