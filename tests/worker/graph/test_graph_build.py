"""CSC construction, edge transforms and RCMK reordering (build/reorder/ids modules)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.graph import GraphStore, UnknownNodeError
from hopserve.worker.graph.build import build_csc
from hopserve.worker.graph.ids import IdIndex, first_duplicate
from hopserve.worker.graph.reorder import invert_permutation, permute_csc, rcmk_permutation

EDGES = [(0, 1), (2, 1), (1, 2), (3, 0), (0, 1), (2, 2), (4, 3)]  # dup (0,1), loop (2,2)


def _csc_dict(csc, n):
    perm = csc.perm if csc.perm is not None else np.arange(n)
    out = {}
    for s in range(n):
        seg = csc.indices[csc.indptr[s] : csc.indptr[s + 1]].astype(np.int64)
        assert np.all(np.diff(seg) >= 0)
        out[int(perm[s])] = sorted(int(perm[v]) for v in seg)
    return out


def test_csc_matches_scipy_identity():
    rng = np.random.default_rng(0)
    n, e = 50, 400
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    csc = build_csc(src, dst, n, reorder=None)
    ref = sp.csc_matrix((np.ones(e), (src, dst)), shape=(n, n))  # column d holds sources
    ref.sum_duplicates()
    assert csc.perm is None and csc.indptr.dtype == np.int64 and csc.indices.dtype == np.int32
    np.testing.assert_array_equal(csc.indptr[-1], e)
    for d in range(n):
        seg = csc.indices[csc.indptr[d] : csc.indptr[d + 1]]
        expect = np.repeat(
            ref.indices[ref.indptr[d] : ref.indptr[d + 1]],
            ref.data[ref.indptr[d] : ref.indptr[d + 1]].astype(int),
        )
        np.testing.assert_array_equal(seg, np.sort(expect))


@pytest.mark.parametrize("symmetrize", [False, True])
@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize("dedup", [False, True])
@pytest.mark.parametrize("reorder", [None, "rcmk"])
def test_transforms_match_reference(reference, symmetrize, self_loops, dedup, reorder):
    src, dst = np.array(EDGES).T
    n = 6  # node 5 isolated
    csc = build_csc(
        src, dst, n, symmetrize=symmetrize, add_self_loops=self_loops, dedup=dedup, reorder=reorder
    )
    expect = reference(EDGES, n, symmetrize=symmetrize, add_self_loops=self_loops, dedup=dedup)
    assert _csc_dict(csc, n) == expect
    assert csc.flags.symmetrized == symmetrize and csc.flags.dedup == dedup
    assert csc.ordering == ("rcmk" if reorder else "identity")


def test_symmetrize_semantics_documented():
    # (0,1) and (1,0) both present: nothing is missing, so symmetrize adds nothing
    # (it used to add a second copy of each; see test_graph_symmetrize.py).
    src, dst = np.array([0, 1]), np.array([1, 0])
    assert build_csc(src, dst, 2, symmetrize=True, reorder=None).num_edges == 2
    assert build_csc(src, dst, 2, symmetrize=True, dedup=True, reorder=None).num_edges == 2
    # only (0,1): its reverse is added
    assert build_csc([0], [1], 2, symmetrize=True, reorder=None).num_edges == 2
    # self-loops are not doubled by symmetrize
    assert build_csc([0], [0], 1, symmetrize=True, reorder=None).num_edges == 1


def test_self_loops_only_where_missing():
    csc = build_csc([0, 1, 1], [0, 1, 1], 3, add_self_loops=True, reorder=None)
    assert _csc_dict(csc, 3) == {0: [0], 1: [1, 1], 2: [2]}


def test_bad_edges_and_options():
    with pytest.raises(ValueError, match="out of range"):
        build_csc([0, 5], [1, 1], 3)
    with pytest.raises(ValueError, match="out of range"):
        build_csc([0, -1], [1, 1], 3)
    with pytest.raises(ValueError, match="integers"):
        build_csc(np.array([0.0]), np.array([1.0]), 3)
    with pytest.raises(ValueError, match="equal length"):
        build_csc([0, 1], [1], 3)
    with pytest.raises(ValueError, match="reorder"):
        build_csc([0], [1], 3, reorder="metis")


def test_empty_graphs():
    csc = build_csc([], [], 0)
    assert csc.num_nodes == 0 and csc.num_edges == 0
    csc = build_csc(np.zeros(0, np.int64), np.zeros(0, np.int64), 4)
    assert csc.indptr.tolist() == [0, 0, 0, 0, 0]


def test_rcmk_is_a_permutation_and_reduces_bandwidth():
    # a path graph with shuffled labels: RCMK recovers a low-bandwidth order
    rng = np.random.default_rng(1)
    n = 200
    label = rng.permutation(n)
    src, dst = label[:-1], label[1:]
    csc = build_csc(src, dst, n, symmetrize=True, reorder="rcmk")
    assert sorted(csc.perm.tolist()) == list(range(n))
    dst_s = np.repeat(np.arange(n), np.diff(csc.indptr))
    assert np.abs(dst_s - csc.indices).max() <= 2
    ident = build_csc(src, dst, n, symmetrize=True, reorder=None)
    dst_i = np.repeat(np.arange(n), np.diff(ident.indptr))
    assert np.abs(dst_i - ident.indices).max() > 10


def test_permute_csc_round_trip():
    rng = np.random.default_rng(2)
    n = 30
    csc = build_csc(rng.integers(0, n, 100), rng.integers(0, n, 100), n, reorder=None)
    perm = rng.permutation(n)
    p_indptr, p_indices = permute_csc(csc.indptr, csc.indices, perm)
    back_indptr, back_indices = permute_csc(p_indptr, p_indices, invert_permutation(perm))
    np.testing.assert_array_equal(back_indptr, csc.indptr)
    np.testing.assert_array_equal(back_indices, csc.indices)
    assert rcmk_permutation(csc.indptr, csc.indices, n).dtype == np.int64


def test_rcmk_store_round_trip_ids_and_features(adjacency, reference):
    rng = np.random.default_rng(3)
    n, e = 40, 120
    ei = torch.from_numpy(rng.integers(0, n, (2, e)))
    x = torch.randn(n, 5)
    y = torch.from_numpy(rng.integers(0, 3, n))
    g = GraphStore.from_edge_index(ei, x, labels=y, reorder="rcmk")
    assert g.ordering == "rcmk" and g.node_ids is not None
    order = g.to_storage(torch.arange(n))
    torch.testing.assert_close(g.features[order], x)  # features permuted consistently
    torch.testing.assert_close(g.labels[order], y)
    torch.testing.assert_close(g.to_external(order), torch.arange(n))
    assert adjacency(g) == reference(ei.T.tolist(), n)
    # sorted_external_order: storage indices by ascending caller ID
    torch.testing.assert_close(g.node_ids[g.sorted_external_order()], torch.arange(n))


def test_id_index_dense_and_sorted():
    dense = IdIndex(np.array([2, 0, 1]), 3)
    assert dense.kind == "dense"
    np.testing.assert_array_equal(dense.lookup(np.array([0, 1, 2])), [1, 2, 0])
    sparse = IdIndex(np.array([100, -5, 7]), 3)
    assert sparse.kind == "sorted"
    np.testing.assert_array_equal(sparse.lookup(np.array([[7, 100], [-5, 7]])), [[2, 0], [1, 2]])
    np.testing.assert_array_equal(sparse.sorted_order(), [1, 2, 0])
    with pytest.raises(UnknownNodeError) as info:
        sparse.lookup(np.array([7, 8, 9, 8, 1000000]))
    err = info.value
    assert err.unknown.tolist() == [8, 9, 1000000]
    assert str(err) == "unknown node IDs (4 of 5 requested): 8, 9, 1000000"
    assert isinstance(err, KeyError)
    with pytest.raises(ValueError, match="duplicate"):
        IdIndex(np.array([0, 0, 1]), 3)
    with pytest.raises(ValueError, match="duplicate"):
        IdIndex(np.array([5, 9, 5]), 3)


def test_unknown_node_error_lists_at_most_ten():
    err = UnknownNodeError(np.arange(100, 125), 30)
    assert "(25 of 30 requested)" in str(err) and "15 more" in str(err)
    assert str(err).count(",") == 10


def test_first_duplicate():
    assert first_duplicate(np.array([3, 1, 2])) is None
    assert first_duplicate(np.array([5, 1, 7, 1, 5])) == (3, 1)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 12),
    edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=40),
    symmetrize=st.booleans(),
    self_loops=st.booleans(),
    dedup=st.booleans(),
    reorder=st.sampled_from([None, "rcmk"]),
    external=st.booleans(),
)
def test_property_random_edge_lists(
    reference, adjacency, n, edges, symmetrize, self_loops, dedup, reorder, external
):
    edges = [(s % n, d % n) for s, d in edges]
    ei = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).T
    x = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
    ids = torch.arange(n) * 10 + 3 if external else None
    g = GraphStore.from_edge_index(
        ei,
        x,
        node_ids=ids,
        reorder=reorder,
        symmetrize=symmetrize,
        add_self_loops=self_loops,
        dedup=dedup,
    )
    ref = reference(edges, n, symmetrize=symmetrize, add_self_loops=self_loops, dedup=dedup)
    to_ext = (lambda v: v * 10 + 3) if external else (lambda v: v)
    expect = {to_ext(v): sorted(to_ext(s) for s in srcs) for v, srcs in ref.items()}
    assert adjacency(g) == expect
    assert int(g.in_degrees.sum()) == g.num_edges == int(g.out_degrees.sum())
    assert g.indptr[-1] == g.num_edges
    caller = torch.arange(n) if ids is None else ids
    storage = g.to_storage(caller)
    torch.testing.assert_close(g.features[storage], x)
    torch.testing.assert_close(g.to_external(storage), caller)
    if reorder is None and ids is None:
        assert g.node_ids is None and g.features.data_ptr() == x.data_ptr()
