"""Partition and halo: contiguous ranges balanced by edges; halos equal brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.distributed.halo import HaloPlan, halo_ids, recv_counts
from hopserve.worker.distributed.partition import partition_by_edges


def csc(num_nodes: int, edges: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of ``(src, dst)`` edges, in-edges grouped by destination."""
    edges = sorted(edges, key=lambda e: (e[1], e[0]))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    for _, d in edges:
        indptr[d + 1] += 1
    return np.cumsum(indptr), np.array([s for s, _ in edges], dtype=np.int32)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    world=st.integers(1, 8),
    data=st.data(),
)
def test_ranges_cover_every_node_once_and_halos_are_exact(n: int, world: int, data) -> None:
    if n < world:
        with pytest.raises(ValueError, match="fewer than the"):
            partition_by_edges(np.zeros(n + 1, dtype=np.int64), world)
        return
    edges = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))))
    indptr, indices = csc(n, edges)
    part = partition_by_edges(indptr, world)
    assert part.bounds[0] == 0 and part.bounds[-1] == n and part.world_size == world
    assert all(a < b for a, b in zip(part.bounds, part.bounds[1:], strict=False))
    owners = part.owners(np.arange(n))
    for rank in range(world):
        start, end = part.range(rank)
        assert (owners[start:end] == rank).all()
        need = halo_ids(indptr, indices, start, end)
        want = sorted({s for s, d in edges if start <= d < end and not start <= s < end})
        assert need.tolist() == want
        counts = recv_counts(part, need)
        assert sum(counts) == need.size and counts[rank] == 0


def test_balanced_by_edges_not_nodes() -> None:
    # Node 0 has 90 in-edges, the other 99 nodes one each: 2 ranks split the work
    # (edges + rows: 90 + 1 vs 99 + 99) near the middle of the cost, not of the nodes.
    edges = [(i % 100, 0) for i in range(90)] + [(0, d) for d in range(1, 100)]
    indptr, _ = csc(100, edges)
    part = partition_by_edges(indptr, 2)
    cost = [int(indptr[b] - indptr[a]) + (b - a) for a, b in (part.range(r) for r in range(2))]
    assert abs(cost[0] - cost[1]) <= 3
    assert part.bounds[1] < 50  # the hub's rank gets fewer rows


def test_halo_table_rows_are_ascending() -> None:
    plan = HaloPlan(1, 10, 20, np.array([2, 5, 25]), (2, 0, 1), np.empty(0, np.int64), (0,) * 3)
    assert plan.rows.tolist() == [2, 5, *range(10, 20), 25]
    assert plan.split == 2
