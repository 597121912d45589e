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
