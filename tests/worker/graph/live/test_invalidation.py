"""affected_nodes: equal to a brute-force oracle, and a superset of the rows that change.

The oracle is written per node, backwards: the layer-``L`` row of ``x`` reads, through
``k`` hops of in-edges (the graph after the batch), the nodes ``W_k(x)`` that reach ``x``
by a walk of exactly ``k`` edges. It can change when

* a node whose features were set is in ``W_0 … W_L`` (a feature travels ``L`` hops);
* a node whose in-edge list changed (a destination of an added or removed edge) is in
  ``W_0 … W_{L-1}`` (its layer-1 row changes, then travels ``L - 1`` hops);
* degree-normalized only: a node whose degree changed (an endpoint of an added or
  removed edge) is in ``W_1 … W_L`` (a degree enters the rows of its out-neighbours).

The semantic check runs real PyG models over the whole graph before and after the batch
(GCNConv and a conv normalized by the sources' out-degrees for the degree-normalized set,
SAGEConv for the degree-free one): every row of an old node that changed must be in the
set.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.live_graph import ID_KINDS, NaiveGraph, build_store, random_batch

from hopserve.worker.graph.live import MutationBatch, affected_nodes
from hopserve.worker.graph.live.mutations import resolve
from hopserve.worker.graph.live.snapshot import GraphSnapshot, apply_batch

DIM = 4


def one_mutation(rnd, g: NaiveGraph) -> MutationBatch:
    """A batch of one kind, touching one or two nodes (a sparse graph keeps most rows
    outside its affected set: what makes a missing term visible)."""
    kinds = ["add_edge", "set", "add_node"] + (["remove_edge"] if g.edges else [])
    kind = rnd.choice(kinds)
    ids = sorted(g.ids)
    row = np.array([[rnd.uniform(-2, 2) for _ in range(DIM)]], np.float32)
    if kind == "add_edge":
        return MutationBatch(add_src=[rnd.choice(ids)], add_dst=[rnd.choice(ids)])
    if kind == "remove_edge":
        s, d = rnd.choice(sorted(g.edges))
        return MutationBatch(remove_src=[s], remove_dst=[d])
    if kind == "set":
        return MutationBatch(set_node_ids=[rnd.choice(ids)], set_features=row)
    new, other = max(ids) + 1, rnd.choice(ids)
    src, dst = (new, other) if rnd.random() < 0.5 else (other, new)
    return MutationBatch(add_node_ids=[new], add_node_features=row, add_src=[src], add_dst=[dst])


@st.composite
def cases(draw):
    """A small graph (isolated nodes, repeats, self-loops) and a random valid batch:
    mixed, or of a single mutation."""
    n = draw(st.integers(1, 24))
    node = st.integers(0, n - 1)
    m = draw(st.integers(0, 2 * n))  # a list's length: drawn, or it stays near empty
    edges = draw(st.lists(st.tuples(node, node), min_size=m, max_size=m))
    id_kind = draw(st.sampled_from(ID_KINDS))
    rnd = draw(st.randoms(use_true_random=False))
    store = build_store(edges, n, DIM, id_kind=id_kind, seed=rnd.randrange(1000))
    before = GraphSnapshot.of(store.topology)
    g = NaiveGraph.of_store(store)
    single = draw(st.booleans())
    batch = one_mutation(rnd, g) if single else random_batch(rnd, g, DIM)
    resolved = resolve(batch, before, 1)
    return store, before, resolved, apply_batch(before, resolved)


def oracle(after: GraphSnapshot, batch, num_layers: int, degree_normalized: bool) -> set[int]:
    """The affected set by the definition in the module docstring (Python sets, per node)."""
    n = after.num_nodes
    in_nbrs = [set() for _ in range(n)]
    ei = after.edge_index()
    for s, d in zip(ei[0].tolist(), ei[1].tolist(), strict=True):
        in_nbrs[d].add(s)
    feats = set(batch.set_nodes.tolist())
    dsts = set(batch.add_dst.tolist()) | set(batch.remove_dst.tolist())
    endpoints = dsts | set(batch.add_src.tolist()) | set(batch.remove_src.tolist())
    out = set()
    for x in range(n):
        walks = [{x}]  # walks[k]: nodes with a walk of exactly k edges to x
        for _ in range(num_layers):
            walks.append(set().union(*(in_nbrs[w] for w in walks[-1])))
        hit = any(feats & walks[k] for k in range(num_layers + 1))
        hit |= any(dsts & walks[k] for k in range(num_layers))
        if degree_normalized:
            hit |= any(endpoints & walks[k] for k in range(1, num_layers + 1))
        if hit:
            out.add(x)
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_affected_nodes_equals_the_oracle(case) -> None:
    _, before, resolved, after = case
    for num_layers in (1, 2, 3):
        for degree_normalized in (False, True):
            got = affected_nodes(after, resolved, num_layers, degree_normalized)
            assert got.dtype == np.int64
            assert np.all(np.diff(got) > 0), "not sorted and unique"
            want = oracle(after, resolved, num_layers, degree_normalized)
            assert set(got.tolist()) == want, (num_layers, degree_normalized)
            # more layers or degree normalization never shrink the set
            if num_layers > 1:
                fewer = affected_nodes(after, resolved, num_layers - 1, degree_normalized)
                assert set(fewer.tolist()) <= want
            if degree_normalized:
                free = affected_nodes(after, resolved, num_layers, False)
                assert set(free.tolist()) <= want


# ------------------------------------------------------------------ real models
class Stack(torch.nn.Module):
    def __init__(self, convs: list[torch.nn.Module]) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = torch.tanh(x)
        return x


def out_degree_conv():
    """``h_x = W · Σ_{u→x} h_u / sqrt(outdeg(u) · indeg(x)) + b`` (DGL GraphConv's
    ``norm="both"``): a conv that reads the *sources'* out-degrees, which PyG's gcn_norm
    (in-degrees on both ends) never does."""
    from torch_geometric.nn import MessagePassing
    from torch_geometric.utils import degree

    class OutDegreeConv(MessagePassing):
        def __init__(self) -> None:
            super().__init__(aggr="add")
            self.lin = torch.nn.Linear(DIM, DIM)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            src, dst = edge_index
            out_deg = degree(src, x.size(0)).clamp(min=1)
            in_deg = degree(dst, x.size(0)).clamp(min=1)
            norm = (out_deg[src] * in_deg[dst]).rsqrt()
            return self.lin(self.propagate(edge_index, x=x, norm=norm))

        def message(self, x_j: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
            return norm.view(-1, 1) * x_j

    return OutDegreeConv()


def models() -> dict[tuple[str, int], tuple[torch.nn.Module, bool]]:
    """(name, layers) -> (model, degree_normalized)."""
    from torch_geometric.nn import GCNConv, SAGEConv

    torch.manual_seed(0)
    out = {}
    for layers in (2, 3):
        out[("gcn", layers)] = (Stack([GCNConv(DIM, DIM) for _ in range(layers)]), True)
        out[("sage", layers)] = (Stack([SAGEConv(DIM, DIM) for _ in range(layers)]), False)
        out[("out-degree", layers)] = (Stack([out_degree_conv() for _ in range(layers)]), True)
    for model, _ in out.values():
        for p in model.parameters():  # no zero bias/weights hiding a change
            torch.nn.init.uniform_(p, -1.0, 1.0)
        model.eval()
    return out


MODELS = models()


def features_after(store, resolved) -> torch.Tensor:
    x = torch.cat([store.features, torch.from_numpy(resolved.new_features)])
    x[torch.from_numpy(resolved.set_nodes)] = torch.from_numpy(resolved.set_features)
    return x


def rows_that_change(model: torch.nn.Module, case) -> set[int]:
    """Old nodes whose rows of ``model``'s own forward differ before and after the batch."""
    store, before, resolved, after = case
    with torch.no_grad():
        y0 = model(store.features, torch.from_numpy(before.edge_index()))
        y1 = model(features_after(store, resolved), torch.from_numpy(after.edge_index()))
    y1 = y1[: before.num_nodes]
    scale = max(float(y0.abs().max()), float(y1.abs().max()), 1.0)
    return set(((y0 - y1).abs() > 1e-5 * scale).any(dim=1).nonzero().flatten().tolist())


@pytest.mark.parametrize("name", sorted({name for name, _ in MODELS}))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_rows_that_change_are_affected(name: str, case) -> None:
    _, _, resolved, after = case
    for layers in (2, 3):
        model, degree_normalized = MODELS[(name, layers)]
        changed = rows_that_change(model, case)
        affected = set(affected_nodes(after, resolved, layers, degree_normalized).tolist())
        missed = sorted(changed - affected)
        assert not missed, f"{name} x{layers}: rows {missed} changed but are not affected"


# ------------------------------------------------------------------ both ways
def oracle_both_ways(after: GraphSnapshot, batch, num_layers: int) -> set[int]:
    """Rows reading in- and out-neighbours (DirGNNConv): the nodes within ``num_layers``
    hops, either way, of a changed edge's end or an updated row."""
    n = after.num_nodes
    nbrs = [set() for _ in range(n)]
    ei = after.edge_index()
    for s, d in zip(ei[0].tolist(), ei[1].tolist(), strict=True):
        nbrs[d].add(s)
        nbrs[s].add(d)
    ball = set(batch.set_nodes.tolist())
    for part in (batch.add_src, batch.add_dst, batch.remove_src, batch.remove_dst):
        ball |= set(part.tolist())
    for _ in range(num_layers):
        ball |= set().union(*(nbrs[w] for w in ball))
    return ball


def dir_models() -> dict[tuple[str, int], torch.nn.Module]:
    from torch_geometric.nn import DirGNNConv, GCNConv, SAGEConv

    torch.manual_seed(1)
    out = {}
    for layers in (2, 3):
        for name, conv in (("dir-gcn", GCNConv), ("dir-sage", SAGEConv)):
            out[(name, layers)] = Stack([DirGNNConv(conv(DIM, DIM)) for _ in range(layers)])
    for model in out.values():
        for p in model.parameters():
            torch.nn.init.uniform_(p, -1.0, 1.0)
        model.eval()
    return out


DIR_MODELS = dir_models()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_both_ways_affected_nodes_equal_the_oracle(case) -> None:
    _, _, resolved, after = case
    for num_layers in (1, 2, 3):
        got = affected_nodes(after, resolved, num_layers, True, True, both_ways=True)
        assert np.all(np.diff(got) > 0), "not sorted and unique"
        assert set(got.tolist()) == oracle_both_ways(after, resolved, num_layers)
        one_way = affected_nodes(after, resolved, num_layers, True, True)
        assert set(one_way.tolist()) <= set(got.tolist())


@pytest.mark.parametrize("name", sorted({name for name, _ in DIR_MODELS}))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_rows_reading_out_edges_that_change_are_affected(name: str, case) -> None:
    _, _, resolved, after = case
    for layers in (2, 3):
        changed = rows_that_change(DIR_MODELS[(name, layers)], case)
        affected = affected_nodes(after, resolved, layers, True, True, both_ways=True)
        missed = sorted(changed - set(affected.tolist()))
        assert not missed, f"{name} x{layers}: rows {missed} changed but are not affected"
