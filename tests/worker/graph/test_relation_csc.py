"""Each relation's own CSC (:class:`RelationCSC`): for any destination range, relation
``r``'s slice holds exactly the store's ``r``-in-edges of those destinations, in the
store's CSC order, with offsets per destination (ranges before, across and past the
relation's destinations, empty relations and ranges, built in one run of edges or many);
source types per relation."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.graph import GraphStore, relation_csc
from hopserve.worker.graph.relation_csc import RelationCSC


def _scan(indptr, indices, edge_type, r, start, end):
    """The reference: scan the range's relation ids (what a batch did per relation)."""
    pos = np.arange(indptr[start], indptr[end])
    keep = edge_type[pos] == r
    counts = [int(keep[indptr[v] - indptr[start] : indptr[v + 1] - indptr[start]].sum())
              for v in range(start, end)]  # fmt: skip
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]), indices[pos[keep]]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    e=st.integers(0, 150),
    relations=st.integers(1, 4),
    one_sided=st.booleans(),
    chunk=st.sampled_from([1, 3, 17, 1 << 20]),
    seed=st.integers(0, 2**31 - 1),
)
def test_slices_equal_a_scan_of_the_relation_ids(n, e, relations, one_sided, chunk, seed):
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, n, e))
    src = rng.integers(0, n, e).astype(np.int32)
    edge_type = rng.integers(0, relations, e).astype(np.int16)
    if one_sided:  # relation 0 only into the low half: ranges before and past its ends
        edge_type[dst >= n // 2] = np.maximum(edge_type[dst >= n // 2], 1) % relations
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    saved, relation_csc._CHUNK_EDGES = relation_csc._CHUNK_EDGES, chunk  # built in runs
    try:
        index = RelationCSC.build(indptr, src, edge_type, relations + 1)  # the last: empty
    finally:
        relation_csc._CHUNK_EDGES = saved
    for _ in range(8):
        start = int(rng.integers(0, n + 1))
        end = int(rng.integers(start, n + 1))
        for r in range(relations + 1):
            local, sources = index.in_edges(r, start, end)
            want_ptr, want_src = _scan(indptr, src, edge_type, r, start, end)
            assert local.dtype == torch.int64 and local.tolist() == want_ptr.tolist()
            assert sources.tolist() == want_src.tolist(), (r, start, end)
    assert index.source_types is None
    offsets = 4 * (2 * e + relations + 1)  # int32: at most two entries per edge, one each
    assert index.nbytes <= src.nbytes + offsets


def test_a_sparse_relation_keeps_the_destinations_it_has_not_its_span():
    """Three edges into destinations 10, 500 and 990 of 1000: the offsets are those three
    destinations', and every range (before, between, across and past them) still reads
    exactly their edges."""
    n = 1000
    dst = np.array([10, 10, 500, 990, 990, 990])
    src = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
    edge_type = np.array([0, 1, 0, 0, 1, 0], dtype=np.int16)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    index = RelationCSC.build(indptr, src, edge_type, 2)
    assert index.dst[0].tolist() == [10, 500, 990] and index.indptr[0].numel() == 4
    for start, end in [(0, 5), (0, 11), (10, 11), (11, 500), (400, 991), (991, 1000), (0, n)]:
        for r in (0, 1):
            local, sources = index.in_edges(r, start, end)
            want_ptr, want_src = _scan(indptr, src, edge_type, r, start, end)
            assert local.tolist() == want_ptr.tolist(), (r, start, end)
            assert sources.tolist() == want_src.tolist(), (r, start, end)


def test_a_typed_store_records_each_relations_source_types():
    """Relations from one type record that type; a relation whose sources are of two
    types (a bare typed edge list) records both, so a layer falls back to checking."""
    x = {"user": torch.randn(4, 3), "item": torch.randn(3, 3)}
    edges = {
        ("user", "clicks", "item"): torch.tensor([[0, 1, 3], [0, 0, 2]]),
        ("item", "clicked_by", "user"): torch.tensor([[0, 2], [1, 3]]),
    }
    store = GraphStore.from_hetero(x, edges)
    index = store.relation_csc
    assert index is store.relation_csc  # built once per store
    types = [t.name for t in store.node_types]
    for r, name in enumerate(store.relations):
        src_type = name.split("__")[0]
        assert index.source_types[r] == {types.index(src_type)}, name
    mixed = RelationCSC.build(
        np.array([0, 2, 2]), np.array([0, 1]), np.array([0, 0]), 1, lambda ids: ids
    )
    assert mixed.source_types == (frozenset({0, 1}),)


def test_an_untyped_store_has_none():
    store = GraphStore.from_edge_index(torch.tensor([[0, 1], [1, 0]]), torch.randn(2, 3))
    assert store.relation_csc is None


def test_a_store_made_for_one_request_builds_no_index():
    """A live graph's request delta is a store for one request: a full layer on it scans
    (building the index would cost O(E) per request, for one layer)."""
    x = {"user": torch.randn(4, 3), "item": torch.randn(3, 3)}
    edges = {("user", "clicks", "item"): torch.tensor([[0, 1, 3], [0, 0, 2]])}
    store = GraphStore.from_hetero(x, edges)
    once = GraphStore(
        meta=store.meta,
        indptr=store.indptr,
        indices=store.indices,
        features=store.features,
        topology=store.topology,
        per_request=True,
    )
    assert once.relation_csc is None and store.relation_csc is not None
