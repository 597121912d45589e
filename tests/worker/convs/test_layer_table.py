"""``csr_weighted_sum``: both of its CPU kernels give each row's sum of weighted source rows."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.convs import layer_table
from hopserve.worker.convs.layer_table import csr_weighted_sum


@settings(max_examples=60, deadline=None)
@given(
    num_dst=st.integers(0, 12),
    num_src=st.integers(1, 15),
    num_edges=st.integers(0, 60),
    width=st.sampled_from([1, 5, layer_table.REDUCE_KERNEL_MIN_WIDTH - 1, 64, 130]),
    int32=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_weighted_sum_equals_the_sum_of_products(num_dst, num_src, num_edges, width, int32, seed):
    gen = torch.Generator().manual_seed(seed)
    num_edges = num_edges if num_dst else 0
    dst = torch.sort(torch.randint(max(num_dst, 1), (num_edges,), generator=gen)).values
    indptr = torch.zeros(num_dst + 1, dtype=torch.long)
    if num_dst:
        indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)
    indices = torch.randint(num_src, (num_edges,), generator=gen)
    values = torch.randn(num_edges, generator=gen)
    dense = torch.randn(num_src, width, generator=gen) * 10
    want = torch.zeros(num_dst, width, dtype=torch.float64)
    want.index_add_(0, dst, values.double()[:, None] * dense.double()[indices])
    if int32:
        indptr, indices = indptr.int(), indices.int()
    got = csr_weighted_sum(indptr, indices, values, dense, (num_dst, num_src))
    assert got.shape == (num_dst, width) and got.dtype == torch.float32
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-5 * scale)


def test_wide_rows_take_the_reduce_kernel(monkeypatch):
    """From ``REDUCE_KERNEL_MIN_WIDTH`` columns on the sum runs ``torch.sparse.mm(…, "sum")``
    (1.2-1.4x the speed of ``adj @ x`` there), below it ``adj @ x``."""
    calls = []
    real = torch.sparse.mm
    monkeypatch.setattr(torch.sparse, "mm", lambda *a: calls.append(len(a)) or real(*a))
    indptr, indices = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    values = torch.ones(3)
    for width in (layer_table.REDUCE_KERNEL_MIN_WIDTH - 1, layer_table.REDUCE_KERNEL_MIN_WIDTH):
        csr_weighted_sum(indptr, indices, values, torch.ones(3, width), (2, 3))
    assert calls == [3]  # the wide one, with its reduce argument
