"""``_compact`` (a typed layer's relation source table) equals ``torch.unique``'s sorted
values and inverse, by a mark per row and by a sort, with and without a keep mask."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.convs.hetero import _compact


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_compact_equals_unique(n, data):
    index = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=60)), dtype=torch.long)
    keep = torch.tensor(
        data.draw(st.lists(st.booleans(), min_size=len(index), max_size=len(index))),
        dtype=torch.bool,
    )
    for mask in (None, keep):
        chosen = index if mask is None else index[mask]
        want = torch.unique(chosen)
        uniq, position = _compact(index, n, mask)
        assert torch.equal(uniq, want)
        where = slice(None) if mask is None else mask
        assert torch.equal(uniq[position[where]], index[where])
