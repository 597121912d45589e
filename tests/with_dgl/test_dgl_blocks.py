"""The DGL block of a batch: ``csc_block`` builds what ``dgl.create_block`` builds."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from hopserve.worker.convs.base import LayerBatch, StoreSliceBatch  # noqa: E402
from hopserve.worker.convs.dgl_conv import _spmm_block_class, csc_block, dgl_block  # noqa: E402

pytestmark = pytest.mark.dgl


def _random_csc(num_src: int, num_dst: int, num_edges: int, gen: torch.Generator):
    """Random destination-sorted edges as a CSC (``dst``, ``indptr``, ``indices``,
    ``eids``) and DGL's own ``create_block`` of them."""
    dst = torch.sort(torch.randint(num_dst, (num_edges,), generator=gen)).values
    indices = torch.randint(num_src, (num_edges,), generator=gen)
    indptr = torch.zeros(num_dst + 1, dtype=torch.long)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)
    eids = torch.arange(num_edges)
    want = dgl.create_block(
        ("csc", (indptr, indices, eids)), num_src_nodes=num_src, num_dst_nodes=num_dst
    )
    return dst, indptr, indices, eids, want


@pytest.mark.parametrize(
    ("num_src", "num_dst", "num_edges"), [(50, 20, 300), (9, 9, 0), (40, 1, 7)]
)
def test_csc_block_equals_create_block(num_src, num_dst, num_edges):
    gen = torch.Generator().manual_seed(num_src + num_edges)
    dst, indptr, indices, eids, want = _random_csc(num_src, num_dst, num_edges, gen)
    got = csc_block(indptr, indices, eids, num_src, num_dst)
    assert type(got) is type(want)
    assert (got.num_src_nodes(), got.num_dst_nodes(), got.num_edges()) == (
        num_src,
        num_dst,
        num_edges,
    )
    assert got.canonical_etypes == want.canonical_etypes and got.idtype == want.idtype
    for a, b in zip(got.edges(order="eid"), want.edges(order="eid"), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(num_src, 3, generator=gen)
    w = torch.randn(num_edges, 1, generator=gen)
    for op in (dgl.ops.copy_u_sum, dgl.ops.copy_u_max, dgl.ops.copy_u_mean):
        assert torch.equal(op(got, x), op(want, x)), op.__name__
    assert torch.equal(dgl.ops.u_mul_e_sum(got, x, w), dgl.ops.u_mul_e_sum(want, x, w))
    assert torch.equal(got.in_degrees(), want.in_degrees())


@pytest.mark.parametrize(("num_src", "num_dst", "num_edges"), [(50, 20, 300), (9, 9, 0)])
def test_batch_block_reads_in_degrees_from_its_csc(num_src, num_dst, num_edges):
    """The batch block's own ``in_degrees()`` (its CSC indptr) equals DGL's, so a mean
    reduce divides by the same degrees; other calls are DGL's."""
    gen = torch.Generator().manual_seed(num_dst)
    dst, indptr, indices, eids, want = _random_csc(num_src, num_dst, num_edges, gen)
    batch = LayerBatch(torch.arange(num_src), num_dst, indptr, indices, eids, layer=1)
    got = dgl_block(batch)
    assert isinstance(got, _spmm_block_class())
    degrees = got.in_degrees()
    assert degrees.dtype == want.in_degrees().dtype and torch.equal(degrees, want.in_degrees())
    assert torch.equal(degrees, torch.bincount(dst, minlength=num_dst))
    some = torch.arange(num_dst)[::2]
    assert torch.equal(got.in_degrees(some), want.in_degrees(some))
    x = torch.randn(num_src, 3, generator=gen)
    assert torch.equal(dgl.ops.copy_u_mean(got, x), dgl.ops.copy_u_mean(want, x))
    # A copy DGL makes with another index (int32 ids) answers with DGL's own degrees.
    narrow = got.int()
    assert narrow.in_degrees().dtype == torch.int32
    assert torch.equal(narrow.in_degrees().long(), want.in_degrees())


def test_the_mean_reduce_of_update_all_reads_the_batch_csc(monkeypatch):
    """``update_all`` runs on ``block[etype]``, a new block of the one relation; it keeps
    the batch's CSC, so a mean reduce (``SAGEConv`` mean) divides by the CSC's degrees
    without DGL's own ``in_degrees`` call per batch (it did, through the view), and equals
    DGL's block exactly."""
    import dgl.function as fn
    from dgl.heterograph import DGLBlock

    gen = torch.Generator().manual_seed(3)
    dst, indptr, indices, eids, want = _random_csc(40, 15, 200, gen)
    batch = LayerBatch(torch.arange(40), 15, indptr, indices, eids, layer=1)
    got = dgl_block(batch)
    assert got[got.canonical_etypes[0]]._hopserve_csc[0] is indptr
    calls = []
    real = DGLBlock.in_degrees
    monkeypatch.setattr(DGLBlock, "in_degrees", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(40, 4, generator=gen)
    out = {}
    for name, g in (("got", got), ("want", want)):
        with g.local_scope():
            g.srcdata["h"] = x
            g.update_all(fn.copy_u("h", "m"), fn.mean("m", "o"))
            out[name] = g.dstdata["o"]
        if name == "got":
            assert calls == []
    assert calls  # DGL's own block asks DGL
    assert torch.equal(out["got"], out["want"])


def _full_layer_slice(num_nodes: int, num_edges: int, start: int, end: int, seed: int):
    """Rows ``start:end`` of a full gather-free layer of a random graph, as the engine
    builds them (a :class:`StoreSliceBatch`), its store and the features."""
    from support import random_graph

    from hopserve.worker.engine.batch import build_batch
    from hopserve.worker.graph.planner import LayerFrontier

    _, x, store = random_graph(num_nodes, num_edges, 6, seed=seed, x_seed=seed + 1)
    batch = build_batch(store, LayerFrontier(None), start, end, 1, global_src=True)
    assert isinstance(batch, StoreSliceBatch)
    return batch, store, x


def _convs():
    import dgl.nn as dglnn

    torch.manual_seed(0)
    return {
        "sage-mean": dglnn.SAGEConv(6, 4, "mean"),
        "sage-pool": dglnn.SAGEConv(6, 4, "pool"),
        "graphconv": dglnn.GraphConv(6, 4, norm="right", allow_zero_in_degree=True),
        "gin-max": dglnn.GINConv(None, "max"),
        "gat": dglnn.GATConv(6, 3, 2, allow_zero_in_degree=True),
        "gatv2": dglnn.GATv2Conv(6, 3, 2, allow_zero_in_degree=True),
    }


@pytest.mark.parametrize("name", sorted(_convs()))
def test_a_full_layer_slice_is_an_int32_block_over_the_store(name):
    """A full layer's batch becomes an int32 block whose source ids are the store's own
    slice (no int64 copy, no arange made for the batch), and a DGL conv on it gives what
    it gives on ``dgl.create_block`` of the same int64 CSC (the max reducer's argmax edge
    ids included)."""
    batch, store, x = _full_layer_slice(300, 2500, 40, 210, seed=5)
    block = dgl_block(batch)
    assert block.idtype == torch.int32
    assert batch._src_index is None and batch._edge_ids is None  # nothing made at int64
    a = int(store.indptr[40])
    assert batch.store_indices.data_ptr() == store.indices[a:].data_ptr()
    want = dgl.create_block(
        ("csc", (batch.indptr, batch.src_index, torch.arange(batch.num_edges))),
        num_src_nodes=store.num_nodes,
        num_dst_nodes=batch.num_dst,
    )
    conv = _convs()[name].eval()
    with torch.no_grad():
        got = conv(block, (x, batch.dst_rows(x)))
        ref = conv(want, (x, batch.dst_rows(x)))
    assert torch.equal(got, ref), name


def test_a_slice_over_the_int32_range_keeps_an_int64_block(monkeypatch):
    """Local edge ids must fit the block's index type: a slice of more edges than an int32
    holds is built at int64 from the batch's own indexes."""
    from hopserve.worker.convs import base

    batch, _, _ = _full_layer_slice(100, 900, 0, 100, seed=8)
    monkeypatch.setattr(base, "INT32_MAX", batch.num_edges - 1)
    block = dgl_block(batch)
    assert block.idtype == torch.int64
    degrees = block.in_degrees()
    assert degrees.dtype == torch.int64
    assert torch.equal(degrees, batch.indptr[1:] - batch.indptr[:-1])


@pytest.mark.parametrize("name", ["graphconv", "gat"])
def test_an_int32_block_s_torch_spmm_sums_equal_dgl_s(name, monkeypatch):
    """The block's ``u_mul_e`` sums (edge weights, attention) run as a torch CSR SpMM over
    the slice's int32 CSC, at every batch size: the same as DGL's kernel on an int64
    block."""
    from hopserve.worker.convs import dgl_conv

    monkeypatch.setattr(dgl_conv, "SPMM_MIN_EDGES", 0)
    batch, store, x = _full_layer_slice(300, 2500, 40, 210, seed=6)
    block = dgl_block(batch)
    assert block.idtype == torch.int32 and dgl_conv._own_csc(block)[1].dtype == torch.int32
    want = dgl.create_block(
        ("csc", (batch.indptr, batch.src_index, torch.arange(batch.num_edges))),
        num_src_nodes=store.num_nodes,
        num_dst_nodes=batch.num_dst,
    )
    conv = _convs()[name].eval()
    weight = {"edge_weight": torch.rand(batch.num_edges) + 0.5} if name == "graphconv" else {}
    with torch.no_grad():
        got = conv(block, (x, batch.dst_rows(x)), **weight)
        ref = conv(want, (x, batch.dst_rows(x)), **weight)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
