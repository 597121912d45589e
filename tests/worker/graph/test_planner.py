"""The planner: frontiers equal a reference BFS; sampling is seeded and per node."""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import random_edge_index

from hopserve import GraphStore
from hopserve.worker.graph.planner import (
    plan_frontiers,
    sample_in_edges,
    sampled_csc,
    sampled_in_degrees,
    sampled_out_degrees,
)


def reference_frontiers(edge_index: torch.Tensor, n: int, targets: list[int], layers: int):
    """V^L = targets; V^{l-1} = V^l ∪ in-neighbours(V^l), by plain Python BFS."""
    in_nbrs: dict[int, set[int]] = {v: set() for v in range(n)}
    for s, d in edge_index.t().tolist():
        in_nbrs[d].add(s)
    frontiers = [set(targets)]
    for _ in range(layers):
        nxt = set(frontiers[-1])
        queue = deque(frontiers[-1])
        while queue:
            nxt |= in_nbrs[queue.popleft()]
        frontiers.append(nxt)
    return frontiers[::-1]  # V^0 … V^L


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 50),
    data=st.data(),
    layers=st.integers(1, 4),
)
def test_frontiers_equal_reference_bfs(n, data, layers):
    edges = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=150)
    )
    targets = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10))
    edge_index = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).t()
    store = GraphStore.from_edge_index(edge_index, torch.zeros(n, 1), reorder=None)
    plan = plan_frontiers(store.topology, np.array(targets), layers, shortcut=False)
    want = reference_frontiers(edge_index, n, targets, layers)
    got = [set(f.nodes.tolist()) for f in plan.layers]
    assert got == want


def test_shortcut_takes_all_nodes_once_frontier_is_large():
    n = 400
    edge_index = random_edge_index(n, 4000)
    store = GraphStore.from_edge_index(edge_index, torch.zeros(n, 1), reorder=None)
    plan = plan_frontiers(store.topology, np.arange(50), 3)
    # |V^3| * d_avg = 50 * ~11 >= 400: every lower frontier is "all nodes".
    assert plan.layers[3].nodes is not None
    assert all(f.nodes is None for f in plan.layers[:3])
    assert plan.sizes(n)[:3] == [n, n, n]


def _store():
    n = 500
    edge_index = random_edge_index(n, 8000, seed=4)
    return GraphStore.from_edge_index(edge_index, torch.zeros(n, 1), reorder=None)


def test_sampling_respects_fanout_and_is_reproducible():
    store = _store()
    targets = np.array([1, 7, 9, 300])
    a = plan_frontiers(store.topology, targets, 2, fanouts=[3, 5], seed=1)
    b = plan_frontiers(store.topology, targets, 2, fanouts=[3, 5], seed=1)
    c = plan_frontiers(store.topology, targets, 2, fanouts=[3, 5], seed=2)
    for layer, fanout in ((1, 3), (2, 5)):
        counts = np.diff(a.layers[layer].indptr)
        full = store.topology.in_degrees[a.layers[layer].nodes]
        assert np.array_equal(counts, np.minimum(full, fanout))
        assert np.array_equal(a.layers[layer].edge_ids, b.layers[layer].edge_ids)
    assert not np.array_equal(a.layers[2].edge_ids, c.layers[2].edge_ids)


def test_sampling_of_a_node_does_not_depend_on_its_batch():
    store = _store()
    alone = plan_frontiers(store.topology, np.array([7]), 1, fanouts=[4], seed=3)
    shared = plan_frontiers(store.topology, np.array([7, 1, 300, 2]), 1, fanouts=[4], seed=3)
    pos = int(np.searchsorted(shared.layers[1].nodes, 7))
    ptr = shared.layers[1].indptr
    mine = shared.layers[1].edge_ids[ptr[pos] : ptr[pos + 1]]
    assert np.array_equal(mine, alone.layers[1].edge_ids)


def test_sampled_edges_are_real_in_edges():
    store = _store()
    plan = plan_frontiers(store.topology, np.array([5, 6]), 1, fanouts=[2], seed=0)
    layer = plan.layers[1]
    for i, v in enumerate(layer.nodes.tolist()):
        eids = layer.edge_ids[layer.indptr[i] : layer.indptr[i + 1]]
        indptr = store.topology.indptr
        assert ((eids >= indptr[v]) & (eids < indptr[v + 1])).all()


def test_any_uint64_seed_samples():
    store = _store()
    a = plan_frontiers(store.topology, np.array([1, 2]), 2, fanouts=[2, 2], seed=2**64 - 1)
    b = plan_frontiers(store.topology, np.array([1, 2]), 2, fanouts=[2, 2], seed=2**64 - 1)
    assert np.array_equal(a.layers[2].edge_ids, b.layers[2].edge_ids)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    data=st.data(),
    fanout=st.sampled_from([-1, 1, 2, 4]),
    layer=st.integers(1, 3),
    seed=st.integers(0, 2**64 - 1),
)
def test_sampled_degree_helpers_match_the_sampled_graph(n, data, fanout, layer, seed):
    edges = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=100)
    )
    edge_index = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).t()
    topo = GraphStore.from_edge_index(edge_index, torch.zeros(n, 1), reorder=None).topology
    indptr, indices = topo.indptr, topo.indices.astype(np.int64)
    local, pos = sampled_csc(indptr, fanout, layer, seed)
    want_local, want_pos = sample_in_edges(indptr, np.arange(n), fanout, layer, seed)
    assert np.array_equal(local, want_local) and np.array_equal(pos, want_pos)
    src = indices[pos]
    dst = np.repeat(np.arange(n), np.diff(local))
    want_in = np.bincount(dst, minlength=n)
    want_loops = np.bincount(dst[src == dst], minlength=n)
    want_out = np.bincount(src, minlength=n)
    nodes = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=10)), dtype=np.int64)
    all_dst = np.repeat(np.arange(n), topo.in_degrees)
    graph_loops = np.bincount(all_dst[indices == all_dst], minlength=n)
    for known in (None, graph_loops):
        deg, loops = sampled_in_degrees(indptr, indices, nodes, fanout, layer, seed, known)
        assert np.array_equal(deg, want_in[nodes]) and np.array_equal(loops, want_loops[nodes])
    assert np.array_equal(sampled_out_degrees(indptr, indices, n, fanout, layer, seed), want_out)
    weights = np.random.default_rng(seed % 2**32).random(indices.size) + 0.5
    want_weighted = np.bincount(src, weights=weights[pos], minlength=n)
    got = sampled_out_degrees(indptr, indices, n, fanout, layer, seed, weights=weights)
    assert np.allclose(got, want_weighted, rtol=1e-9, atol=1e-12)
