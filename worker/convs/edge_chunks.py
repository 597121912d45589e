"""Chunks of a batch's in-edges: an attention conv's wide per-edge rows within a fixed
workspace, whatever the batch's edge count.

An attention conv needs every in-edge's score before its softmax, but the scores are a
few values per edge (``[E, H]``); the wide rows (gathered keys, queries, values, weighted
messages, ``O(F)`` each) are needed only while one edge is scored or summed. Scoring chunk
by chunk, the softmax over all scores, then the weighted sum chunk by chunk keeps those
rows under :data:`EDGE_CHUNK_BYTES`: a hub with 100K in-edges, batched alone because one
row cannot be split, costs ``O(E·H)`` and one chunk instead of ``O(E·F)``.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["EDGE_CHUNK_BYTES", "KV_TABLE_BYTES", "edge_chunks", "kv_table_fits"]

EDGE_CHUNK_BYTES = 8 << 20
"""Workspace of one chunk's per-edge rows (within the CPU batch target's margin)."""

KV_TABLE_BYTES = 16 << 20
"""Largest table of projected source rows (HGT's keys and values) a batch keeps; past it (a
hub batched alone: one row cannot be split) sources are projected per chunk of edges, a few
more multiply-adds and no table."""


def edge_chunks(num_edges: int, row_bytes: int, workspace: int | None = None) -> Iterator[slice]:
    """Consecutive slices of ``range(num_edges)``, each of at most ``workspace //
    row_bytes`` edges (at least one; ``workspace`` defaults to :data:`EDGE_CHUNK_BYTES`),
    ``row_bytes`` being the bytes one edge's rows take."""
    workspace = EDGE_CHUNK_BYTES if workspace is None else workspace
    step = max(1, workspace // max(1, row_bytes))
    for start in range(0, num_edges, step):
        yield slice(start, min(num_edges, start + step))


def kv_table_fits(num_rows: int, row_bytes: int) -> bool:
    """Whether a table of ``num_rows`` projected source rows of ``row_bytes`` each stays
    within :data:`KV_TABLE_BYTES`."""
    return num_rows * row_bytes <= KV_TABLE_BYTES
