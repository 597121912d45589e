"""Build one batch: destination rows → a local :class:`Block` and its gathered inputs.

Source rows are destination-first; the remaining in-neighbours follow in ascending storage
id (``torch.unique``). For a contiguous run of destinations (full evaluation over RCMK
order) the in-edges are one slice of the CSC and destination membership is a range test.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hopserve.worker.convs.base import Block, Sampling
from hopserve.worker.engine.plan import LayerFrontier, segment_positions


def build_block(
    graph, frontier: LayerFrontier, start: int, end: int, layer: int, global_src: bool = False
) -> Block:
    """The block of rows ``start:end`` of ``frontier`` (layer 0 = no edges).

    With ``global_src`` the sources stay storage ids (no renumbering, no gather): the
    block reads the stored node table directly. A sampled frontier with a fanout ``>= 0``
    marks the block with its :class:`~hopserve.worker.convs.base.Sampling` (layer, fanout,
    seed), so adapters can take degree statistics from the sampled graph.
    """
    dst = torch.arange(start, end) if frontier.nodes is None else frontier.nodes[start:end]
    num_dst = int(dst.numel())
    if layer == 0:
        empty = torch.empty(0, dtype=torch.long)
        return Block(dst, num_dst, torch.zeros(num_dst + 1, dtype=torch.long), empty, empty, 0)

    sampling = None
    if frontier.sampled:
        if frontier.fanout is not None and frontier.fanout >= 0:
            sampling = Sampling(layer, frontier.fanout, int(frontier.seed or 0))
        ptr = frontier.indptr
        a, b = int(ptr[start]), int(ptr[end])
        src = frontier.indices[a:b]
        edge_ids = frontier.edge_ids[a:b]
        indptr = ptr[start : end + 1] - a
    elif frontier.nodes is None:
        a, b = int(graph.indptr[start]), int(graph.indptr[end])
        src = graph.indices[a:b].long()
        edge_ids = torch.arange(a, b)
        indptr = graph.indptr[start : end + 1] - a
    else:
        edge_ids, counts = segment_positions(graph.indptr, dst)
        src = graph.indices[edge_ids].long()
        indptr = torch.zeros(num_dst + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=indptr[1:])

    if global_src:
        return Block(
            dst,
            num_dst,
            indptr,
            src,
            edge_ids,
            layer,
            global_src_size=graph.num_nodes,
            dst_start=start if frontier.nodes is None else None,
            sampling=sampling,
        )
    if frontier.nodes is None:  # dst = start..end-1
        is_dst = (src >= start) & (src < end)
        dst_pos = src - start
    else:
        pos = torch.searchsorted(dst, src).clamp_(max=max(num_dst - 1, 0))
        is_dst = dst[pos] == src
        dst_pos = pos
    others = src[~is_dst]
    uniq, inverse = _unique_inverse(others, graph.num_nodes)
    src_index = torch.empty_like(src)
    src_index[is_dst] = dst_pos[is_dst]
    src_index[~is_dst] = inverse + num_dst
    return Block(
        torch.cat([dst, uniq]), num_dst, indptr, src_index, edge_ids, layer, sampling=sampling
    )


def _unique_inverse(ids: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Sorted unique ``ids`` and each id's position in them.

    A node bitmap is O(N + E) against sorting's O(E log E); it wins while the graph is not
    much larger than the batch's edge list.
    """
    if ids.numel() == 0 or num_nodes > 32 * ids.numel():
        return torch.unique(ids, return_inverse=True)
    seen = torch.zeros(num_nodes, dtype=torch.bool)
    seen[ids] = True
    uniq = seen.nonzero().squeeze(1)
    local = torch.empty(num_nodes, dtype=torch.long)
    local[uniq] = torch.arange(uniq.numel())
    return uniq, local[ids]


def row_positions(rows: Tensor | None, ids: Tensor) -> Tensor:
    """Positions of storage ``ids`` within a stored layer whose rows are ``rows``."""
    return ids if rows is None else torch.searchsorted(rows, ids)
