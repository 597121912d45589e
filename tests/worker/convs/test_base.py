"""A full layer's batch read in place from the store (``StoreSliceBatch``) keeps the
:class:`LayerBatch` contract: its int64 indexes, made on first read, are the ones a
batch built from copies holds."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import random_graph

from hopserve.worker.convs.base import LayerBatch, StoreSliceBatch
from hopserve.worker.engine.batch import build_batch
from hopserve.worker.graph.planner import LayerFrontier


@pytest.fixture(scope="module")
def store():
    return random_graph(120, 900, 3, seed=4, x_seed=5)[2]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_slice_reads_as_the_store_csc(store, data):
    start = data.draw(st.integers(0, store.num_nodes - 1), label="start")
    end = data.draw(st.integers(start + 1, store.num_nodes), label="end")
    batch = build_batch(store, LayerFrontier(None), start, end, 2, global_src=True)
    assert isinstance(batch, StoreSliceBatch)
    a, b = int(store.indptr[start]), int(store.indptr[end])
    assert batch.num_edges == b - a and batch._src_index is None  # counted, not copied
    assert batch.store_indices.dtype == store.indices.dtype
    assert torch.equal(batch.src_index, store.indices[a:b].long())
    assert batch.src_index.dtype == torch.int64
    assert torch.equal(batch.edge_ids, torch.arange(a, b))
    assert torch.equal(batch.indptr, store.indptr[start : end + 1] - a)
    assert torch.equal(batch.dst_nodes, torch.arange(start, end))
    assert (batch.num_dst, batch.num_src, batch.dst_start) == (end - start, store.num_nodes, start)
    assert batch.graph is store and batch.layer == 2
    x = torch.randn(store.num_nodes, 2)
    assert batch.dst_rows(x).data_ptr() == x[start].data_ptr()  # a view


def test_a_slice_for_another_layer_shares_what_it_made(store):
    batch = build_batch(store, LayerFrontier(None), 0, store.num_nodes, 1, global_src=True)
    batch._cache["block"] = object()
    src = batch.src_index
    twin = batch.with_layer(3)
    assert isinstance(twin, StoreSliceBatch) and (twin.layer, batch.layer) == (3, 1)
    assert twin._cache is batch._cache and twin.src_index is src
    assert twin.store_indices is batch.store_indices
    later = batch.with_layer(2)
    edge_ids = twin.edge_ids  # made after both twins were: still made once
    assert later.edge_ids is edge_ids and batch.edge_ids is edge_ids


def test_a_slice_moved_to_a_device_is_a_plain_batch(store):
    batch = build_batch(store, LayerFrontier(None), 10, 50, 1, global_src=True)
    moved = batch.to(torch.device("cpu"))
    assert type(moved) is LayerBatch
    for name in ("indptr", "src_index", "edge_ids", "src_nodes"):
        assert torch.equal(getattr(moved, name), getattr(batch, name)), name
    assert (moved.global_src_size, moved.dst_start) == (batch.global_src_size, batch.dst_start)


def test_only_full_host_layers_read_the_store_in_place(store):
    """Partial frontiers, gathered sources and layer 0 build their own indexes."""
    rows = LayerFrontier(torch.arange(5, 40).numpy())
    assert type(build_batch(store, rows, 0, 20, 1, global_src=True)) is LayerBatch
    assert type(build_batch(store, LayerFrontier(None), 0, 20, 1)) is LayerBatch
    assert type(build_batch(store, LayerFrontier(None), 0, 20, 0, global_src=True)) is LayerBatch


def test_a_slice_hands_kernels_its_int32_csc(store, monkeypatch):
    """``csc()``: a slice's own int32 sources and offsets (no int64 made), a plain batch's
    int64 indexes, and a slice of more edges than int32 offsets hold its int64 ones."""
    from hopserve.worker.convs import base

    batch = build_batch(store, LayerFrontier(None), 7, 90, 1, global_src=True)
    indptr, indices = batch.csc()
    assert (indptr.dtype, indices.dtype) == (torch.int32, torch.int32)
    assert indices is batch.store_indices and batch._src_index is None
    assert torch.equal(indptr.long(), batch.indptr)
    plain = build_batch(store, LayerFrontier(None), 7, 90, 1)
    assert all(a is b for a, b in zip(plain.csc(), (plain.indptr, plain.src_index), strict=True))
    wide = build_batch(store, LayerFrontier(None), 7, 90, 1, global_src=True)
    monkeypatch.setattr(base, "INT32_MAX", wide.num_edges - 1)
    indptr, indices = wide.csc()
    assert (indptr.dtype, indices.dtype) == (torch.int64, torch.int64)
    assert torch.equal(indices, wide.src_index)
