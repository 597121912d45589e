"""apply_batch / splice_csc / build_csr against a naive Python model of the graph.

Random small graphs (isolated nodes, duplicate edges, self-loops; identity, dense and
sparse external IDs) take random valid batches, one after another; after each, the
snapshot's edge multiset, degrees, ID lookups, CSR and ``has_edges`` must equal the naive
model's, every in-edge segment must stay ascending, and the snapshot it was made from must
be unchanged.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.live_graph import ID_KINDS, NaiveGraph, build_store, random_batch

from hopserve.worker.graph.errors import UnknownNodeError
from hopserve.worker.graph.format import indices_dtype_for
from hopserve.worker.graph.live.mutations import resolve
from hopserve.worker.graph.live.snapshot import GraphSnapshot, apply_batch, build_csr, splice_csc

DIM = 3


@st.composite
def small_graphs(draw) -> tuple[int, list[tuple[int, int]], str]:
    """``(n, edges, id_kind)``: up to 12 nodes, edges with repeats and self-loops."""
    n = draw(st.integers(1, 12))
    node = st.integers(0, n - 1)
    edges = draw(st.lists(st.tuples(node, node), max_size=30))
    if edges and draw(st.booleans()):
        edges += draw(st.lists(st.sampled_from(edges), max_size=4))  # duplicates
    return n, edges, draw(st.sampled_from(ID_KINDS))


def frozen(snap: GraphSnapshot) -> dict[str, np.ndarray]:
    """Copies of every array a reader of ``snap`` can see."""
    out = {
        "indptr": np.array(snap.indptr),
        "indices": np.array(snap.indices),
        "in_degrees": np.array(snap.in_degrees),
        "out_degrees": np.array(snap.out_degrees),
        "external": snap.to_external(np.arange(snap.num_nodes)),
    }
    if snap.out_indptr is not None:
        out["out_indptr"] = np.array(snap.out_indptr)
        out["out_indices"] = np.array(snap.out_indices)
    return out


def assert_unchanged(snap: GraphSnapshot, before: dict[str, np.ndarray]) -> None:
    now = frozen(snap)
    assert now.keys() >= before.keys()
    for name, arr in before.items():
        np.testing.assert_array_equal(now[name], arr, err_msg=f"old snapshot's {name} changed")


def assert_matches(snap: GraphSnapshot, g: NaiveGraph) -> None:
    """Every view of ``snap`` equals the naive model ``g``."""
    n = g.num_nodes
    assert snap.num_nodes == n and snap.meta.num_nodes == n
    assert snap.num_edges == sum(g.edges.values()) == snap.indices.size
    assert snap.indptr.dtype == np.int64 and snap.indptr.shape == (n + 1,)
    assert snap.indices.dtype == indices_dtype_for(n)
    ext = snap.to_external(np.arange(n))
    assert ext.tolist() == g.ids
    pos = {v: i for i, v in enumerate(g.ids)}
    # IDs: lookups, misses, sorted order
    np.testing.assert_array_equal(snap.to_storage(np.array(g.ids)), np.arange(n))
    storage, found = snap.find(np.array(g.ids + [5000, -5000]))
    assert found.tolist() == [True] * n + [False, False]
    assert storage[:n].tolist() == list(range(n)) and storage[n:].tolist() == [-1, -1]
    with pytest.raises(UnknownNodeError):
        snap.to_storage([5000])
    assert ext[snap.sorted_external_order].tolist() == sorted(g.ids)
    # edges, as a multiset of external pairs, and in-edge segments ascending
    ei = snap.edge_index()
    got = Counter(zip(ext[ei[0]].tolist(), ext[ei[1]].tolist(), strict=True))
    assert got == g.edges
    for v in range(n):
        seg = snap.indices[snap.indptr[v] : snap.indptr[v + 1]]
        assert np.all(np.diff(seg.astype(np.int64)) >= 0), f"in-edges of {v} not ascending"
    # degrees
    assert snap.in_degrees.tolist() == [g.in_degree(v) for v in g.ids]
    assert snap.out_degrees.tolist() == [g.out_degree(v) for v in g.ids]
    # has_edges over every pair of nodes
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    src, dst = src.ravel(), dst.ravel()
    want = [
        (g.ids[s], g.ids[d]) in g.edges for s, d in zip(src.tolist(), dst.tolist(), strict=True)
    ]
    assert snap.has_edges(src, dst).tolist() == want
    # CSR: out-neighbours by source, ascending, with multiplicity
    snap.ensure_out_edges()
    assert snap.out_indptr.shape == (n + 1,)
    for s in range(n):
        seg = snap.out_indices[snap.out_indptr[s] : snap.out_indptr[s + 1]].tolist()
        want_seg = sorted(
            pos[d] for (a, d), c in g.edges.items() if a == g.ids[s] for _ in range(c)
        )
        assert seg == want_seg, f"out-edges of {s}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=small_graphs(), rnd=st.randoms(use_true_random=False), data=st.data())
def test_apply_batch_equals_naive_model(graph, rnd, data) -> None:
    n, edges, id_kind = graph
    store = build_store(edges, n, DIM, id_kind=id_kind, seed=rnd.randrange(1000))
    g = NaiveGraph.of_store(store)
    snap = GraphSnapshot.of(store.topology)
    assert_matches(snap, g)
    versions = {snap.version}
    for _ in range(data.draw(st.integers(1, 4), label="batches")):
        if data.draw(st.booleans(), label="track out-edges"):
            snap.ensure_out_edges()  # the next snapshot splices the CSR instead of building it
        batch = random_batch(rnd, g, DIM)
        resolved = resolve(batch, snap, snap.seq + 1)
        before = frozen(snap)
        spliced_csr = snap.out_indptr is not None
        nxt = apply_batch(snap, resolved)
        assert_unchanged(snap, before)
        assert nxt.seq == snap.seq + 1 and nxt.version not in versions
        versions.add(nxt.version)
        g.apply(batch)
        if spliced_csr:  # the spliced CSR equals one built from scratch
            fresh = build_csr(nxt.indptr, nxt.indices, nxt.num_nodes)
            np.testing.assert_array_equal(nxt.out_indptr, fresh[0])
            np.testing.assert_array_equal(nxt.out_indices, fresh[1])
        assert_matches(nxt, g)
        assert_unchanged(snap, before)
        snap = nxt


@settings(max_examples=80, deadline=None)
@given(
    n_rows=st.integers(0, 8),
    entries=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 10)), max_size=25),
    extra=st.integers(0, 3),
    data=st.data(),
)
def test_splice_csc_is_remove_all_then_add(n_rows, entries, extra, data) -> None:
    """The compressed-adjacency splice on its own: rows beyond the old ones are new;
    columns are node ids (below the new row count), as in a CSC or a CSR."""
    n_after = n_rows + extra
    entries = [(r, c) for r, c in entries if r < n_rows and c < n_after]
    rows = sorted(entries)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount([r for r, _ in rows], minlength=n_rows), out=indptr[1:])
    indices = np.array([c for _, c in rows], dtype=np.int32)
    cols = st.integers(0, max(n_after, 1) - 1)
    remove = data.draw(st.lists(st.sampled_from(rows), max_size=4)) if rows else []
    remove += data.draw(st.lists(st.tuples(st.integers(0, max(n_rows - 1, 0)), cols), max_size=2))
    remove = [(r, c) for r, c in remove if r < n_rows]
    add = (
        data.draw(st.lists(st.tuples(st.integers(0, n_after - 1), cols), max_size=6))
        if n_after
        else []
    )
    snapshot = (indptr.copy(), indices.copy())

    def arr(pairs, k):
        return np.array([p[k] for p in pairs], dtype=np.int64)

    new_ptr, new_idx, removed, _ = splice_csc(
        indptr, indices, n_after, arr(remove, 0), arr(remove, 1), arr(add, 0), arr(add, 1)
    )
    gone = set(remove)
    want = Counter(p for p in rows if p not in gone) + Counter(add)
    got = Counter()
    assert new_ptr.shape == (n_after + 1,) and new_ptr[0] == 0
    for r in range(n_after):
        seg = new_idx[new_ptr[r] : new_ptr[r + 1]].tolist()
        assert seg == sorted(seg)
        got.update((r, c) for c in seg)
    assert got == want
    assert sorted(removed.tolist()) == sorted(c for r, c in rows if (r, c) in gone)
    np.testing.assert_array_equal(indptr, snapshot[0])
    np.testing.assert_array_equal(indices, snapshot[1])


def test_build_csr_of_a_csc() -> None:
    # in-edges: 0 <- {1, 1, 2}, 1 <- {}, 2 <- {0, 2}
    indptr = np.array([0, 3, 3, 5])
    indices = np.array([1, 1, 2, 0, 2], dtype=np.int32)
    out_ptr, out_idx = build_csr(indptr, indices, 3)
    assert out_ptr.tolist() == [0, 1, 3, 5]
    assert out_idx.tolist() == [2, 0, 0, 0, 2]
