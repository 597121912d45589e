"""Shared helpers for the graph-store tests (tiny graphs, reference adjacency)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import numpy as np
import pytest


def reference_in_neighbours(
    edges: Iterable[tuple[int, int]],
    num_nodes: int,
    *,
    symmetrize: bool = False,
    add_self_loops: bool = False,
    dedup: bool = False,
) -> dict[int, list[int]]:
    """Python-loop reference: node -> sorted in-neighbours (multiset unless dedup).

    ``symmetrize`` adds ``max(0, c(s, d) - c(d, s))`` copies of ``(d, s)`` per distinct
    ``(s, d)``, ``s != d`` (``c`` = multiplicity): only the missing reverse edges.
    """
    edges = [(int(s), int(d)) for s, d in edges]
    if symmetrize:
        count = Counter(edges)
        edges = edges + [
            (d, s) for (s, d), k in count.items() if s != d for _ in range(k - count[(d, s)])
        ]
    if add_self_loops:
        have = {s for s, d in edges if s == d}
        edges = edges + [(v, v) for v in range(num_nodes) if v not in have]
    if dedup:
        edges = sorted(set(edges))
    adj: dict[int, list[int]] = defaultdict(list)
    for s, d in edges:
        adj[d].append(s)
    return {v: sorted(adj.get(v, [])) for v in range(num_nodes)}


def store_in_neighbours(store) -> dict[int, list[int]]:
    """External node ID -> sorted external IDs of its in-neighbours, from a GraphStore."""
    indptr = store.indptr.numpy()
    indices = store.indices.numpy().astype(np.int64)
    ext = store.to_external(np.arange(store.num_nodes)).numpy()
    out = {}
    for s in range(store.num_nodes):
        seg = indices[indptr[s] : indptr[s + 1]]
        assert np.all(np.diff(seg) >= 0), "segment not sorted ascending"
        out[int(ext[s])] = sorted(int(v) for v in ext[seg])
    return out


@pytest.fixture(scope="session")
def reference() -> Callable[..., dict[int, list[int]]]:
    return reference_in_neighbours


@pytest.fixture(scope="session")
def adjacency() -> Callable[..., dict[int, list[int]]]:
    return store_in_neighbours
