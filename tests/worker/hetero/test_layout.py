"""TypeLayout typing storage ids: ``is_type`` agrees with ``types_of`` on every id, for
types stored as one range and as several runs (a live graph's added nodes)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.graph.node_types import NodeTypeInfo
from hopserve.worker.hetero.layout import TypeLayout, TypeRanges


def _layout(counts: list[int]) -> TypeLayout:
    offsets = [0, *torch.tensor(counts).cumsum(0).tolist()]
    types = [
        NodeTypeInfo(name=f"t{k}", offset=offsets[k], count=c, feature_dim=4)
        for k, c in enumerate(counts)
    ]
    names = tuple(t.name for t in types)
    return TypeLayout(names, (4,) * len(types), (), TypeRanges(types))


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=4).filter(lambda c: sum(c) > 0),
    data=st.data(),
)
def test_is_type_agrees_with_types_of(counts, data):
    layout = _layout(counts)
    n = sum(counts)
    ids = torch.tensor(data.draw(st.lists(st.integers(0, n + 3), min_size=1, max_size=30)))
    kinds = layout.types_of(ids, ids.numel(), ids.device)
    for t in range(len(counts)):
        assert layout.is_type(ids, t).tolist() == (kinds == t).tolist()


def test_is_type_over_several_runs_of_a_type():
    layout = _layout([3, 2])
    layout.ranges.bounds = ((0, 3, 5, 7), (0, 1, 0, 1))  # t0: [0,3) and [5,7); t1: the rest
    ids = torch.arange(10)
    assert layout.is_type(ids, 0).tolist() == [1, 1, 1, 0, 0, 1, 1, 0, 0, 0]
    assert layout.is_type(ids, 1).tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert (layout.types_of(ids, 10, ids.device) == 0).tolist() == layout.is_type(ids, 0).tolist()


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 500), min_size=1, max_size=5), rows=st.integers(1, 60))
def test_probe_type_ranges_split_the_probe_rows_evenly_then_restore_the_graph_s(counts, rows):
    """The load-time probes' ranges: every type gets rows of the probe (the graph's own
    ranges would give its few rows to the first type or two), the counts differ by at most
    one, and the graph's ranges come back, also after an error."""
    import pytest

    from hopserve.worker.hetero.layout import probe_type_ranges

    layout = _layout(counts)
    model = torch.nn.Module()
    model.layout = layout
    saved = layout.ranges.bounds, layout.ranges.source
    with probe_type_ranges(model, rows):
        kinds = layout.types_of(None, rows, torch.device("cpu"))
        per_type = torch.bincount(kinds, minlength=len(counts))
        assert (int(per_type.min()) >= 1) == (rows >= len(counts))
        assert int(per_type.max()) - int(per_type.min()) <= 1
        assert kinds.tolist() == sorted(kinds.tolist())  # runs, in type order
    assert (layout.ranges.bounds, layout.ranges.source) == saved
    with pytest.raises(RuntimeError), probe_type_ranges(model, rows):
        raise RuntimeError("a probe failed")
    assert (layout.ranges.bounds, layout.ranges.source) == saved


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=4), extra=st.integers(-3, 3))
def test_last_row_is_the_largest_id_of_its_type(counts, extra):
    """``last_row`` (from the ranges alone) equals the largest row that ``types_of`` gives
    the type, over one range per type and over several runs (a live graph's additions)."""
    for runs in (False, True):
        layout = _layout(counts)
        n = sum(counts)
        if runs and n:
            starts, kinds = layout.ranges.bounds
            layout.ranges.bounds = ((*starts, n + 1, n + 3), (*kinds, kinds[0], kinds[-1]))
            n += 5
        rows = max(n + extra, 0)
        kinds_of = layout.types_of(None, rows, torch.device("cpu"))
        for t in range(len(counts)):
            of_t = (kinds_of == t).nonzero()
            want = int(of_t.max()) if of_t.numel() else -1
            assert layout.last_row(t, rows) == want, (counts, runs, rows, t)
