"""One batch of one layer: destination rows → a local :class:`LayerBatch` and its inputs.

Source rows are destination-first; the remaining in-neighbours follow in ascending storage
id. For a contiguous run of destinations (full evaluation over RCMK order) the in-edges
are one slice of the CSC and destination membership is a range test. :func:`prepare`
gathers the block's input rows (or hands whole node tables over, gather-free) and, on
CUDA, issues their copies on a side stream.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hopserve.worker.convs.base import LayerBatch, Sampling, StoreSliceBatch
from hopserve.worker.convs.layer_table import is_stand_in
from hopserve.worker.engine.device_graph import DeviceGraph
from hopserve.worker.graph.planner import LayerFrontier, segment_positions
from hopserve.worker.trace.blocks import FEATURES, ConvBlock, ModelSplit
from hopserve.worker.trace.splitter import SRC

__all__ = ["FrontierError", "PreparedBatch", "build_batch", "prepare", "row_positions"]

# Bytes a block's local index tensors take per in-edge (indptr share, source index, edge id).
INDEX_BYTES_PER_EDGE = 24


class FrontierError(ValueError):
    """A frontier lacks a row a layer reads (the job's frontiers are inconsistent)."""


def _tensor(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


def build_batch(
    graph,
    frontier: LayerFrontier,
    start: int,
    end: int,
    layer: int,
    global_src: bool = False,
    resident: DeviceGraph | None = None,
) -> LayerBatch:
    """The block of rows ``start:end`` of ``frontier`` (layer 0 = no edges).

    With ``global_src`` the sources stay storage ids (no renumbering, no gather): the
    block reads the stored node table directly. A sampled frontier with a fanout ``>= 0``
    marks the block with its :class:`~hopserve.worker.convs.base.Sampling` (layer, fanout,
    seed), so adapters can take degree statistics from the sampled graph. With the graph
    ``resident`` on the GPU, a block of a full layer is built there from slices of the
    device CSC (nothing built on the host, nothing copied; with global sources, nothing
    more than the slices). On the host, a full layer's batch with global sources is a
    :class:`~hopserve.worker.convs.base.StoreSliceBatch`: the store's CSC slice in place.
    """
    on_device = (
        resident is not None and frontier.nodes is None and not frontier.sampled and layer > 0
    )
    if on_device and global_src:
        return _resident_block(graph, resident, start, end, layer)
    if global_src and layer > 0 and frontier.nodes is None and not frontier.sampled:
        return StoreSliceBatch(graph, start, end, layer)  # the store's CSC slice, in place
    device = resident.indices.device if on_device else torch.device("cpu")
    if frontier.nodes is None:
        dst = torch.arange(start, end, device=device)
    else:
        dst = _tensor(frontier.nodes[start:end])
    num_dst = int(dst.numel())
    if layer == 0:
        empty = torch.empty(0, dtype=torch.long)
        return LayerBatch(dst, num_dst, torch.zeros(num_dst + 1, dtype=torch.long), empty, empty, 0)

    sampling = None
    if frontier.sampled:
        if frontier.fanout is not None and frontier.fanout >= 0:
            sampling = Sampling(layer, frontier.fanout, int(frontier.seed or 0))
        ptr = frontier.indptr
        a, b = int(ptr[start]), int(ptr[end])
        src = _tensor(frontier.indices[a:b])
        edge_ids = _tensor(frontier.edge_ids[a:b])
        indptr = _tensor(ptr[start : end + 1] - a)
    elif on_device:
        a, b = int(graph.indptr[start]), int(graph.indptr[end])  # host copy: no device sync
        src = resident.indices[a:b]
        edge_ids = torch.arange(a, b, device=device)
        indptr = resident.indptr[start : end + 1] - a
    elif frontier.nodes is None:
        a, b = int(graph.indptr[start]), int(graph.indptr[end])
        src = graph.indices[a:b].long()
        edge_ids = torch.arange(a, b)
        indptr = graph.indptr[start : end + 1] - a
    else:
        positions, counts = segment_positions(graph.topology.indptr, frontier.nodes[start:end])
        edge_ids = torch.from_numpy(positions)
        src = graph.indices[edge_ids].long()
        indptr = torch.zeros(num_dst + 1, dtype=torch.long)
        torch.cumsum(torch.from_numpy(counts), 0, out=indptr[1:])

    if global_src:
        return LayerBatch(
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
    batch = LayerBatch(
        torch.cat([dst, uniq]), num_dst, indptr, src_index, edge_ids, layer, sampling=sampling
    )
    _note_local_edge_ids(batch, frontier, start)
    return batch


def _note_local_edge_ids(batch: LayerBatch, frontier: LayerFrontier, start: int) -> None:
    """A full layer's first batch: its store edge ids are its local ones ``0 … E-1``,
    which :func:`~hopserve.worker.convs.dgl_conv.dgl_block` reuses (no second arange)."""
    if frontier.nodes is None and not frontier.sampled and start == 0:
        batch._cache["local_edge_ids"] = batch.edge_ids


def _resident_block(graph, resident: DeviceGraph, start: int, end: int, layer: int) -> LayerBatch:
    """Rows ``start:end`` of a full layer as views of the device CSC (global sources)."""
    a, b = int(graph.indptr[start]), int(graph.indptr[end])  # host copy: no device sync
    device = resident.indices.device
    return LayerBatch(
        torch.arange(start, end, device=device),
        end - start,
        resident.indptr[start : end + 1] - a,
        resident.indices[a:b],
        torch.arange(a, b, device=device),
        layer,
        global_src_size=graph.num_nodes,
        dst_start=start,
    )


def _unique_inverse(ids: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Sorted unique ``ids`` and each id's position in them.

    A node bitmap is O(N + E) against sorting's O(E log E); it wins while the graph is not
    much larger than the batch's edge list.
    """
    if ids.numel() == 0 or num_nodes > 32 * ids.numel():
        return torch.unique(ids, return_inverse=True)
    seen = torch.zeros(num_nodes, dtype=torch.bool, device=ids.device)
    seen[ids] = True
    uniq = seen.nonzero().squeeze(1)
    local = torch.empty(num_nodes, dtype=torch.long, device=ids.device)
    local[uniq] = torch.arange(uniq.numel(), device=ids.device)
    return uniq, local[ids]


def row_positions(rows: Tensor | None, ids: Tensor, what: str = "a stored layer") -> Tensor:
    """Positions of storage ``ids`` within ``rows`` (ascending; ``None`` = all nodes).

    Checked: an id missing from ``rows`` raises :class:`FrontierError` naming it, so an
    inconsistent plan can never read another node's row (O(len(ids))).
    """
    if rows is None:
        return ids
    pos = torch.searchsorted(rows, ids)
    if rows.numel() == 0:
        hit = torch.zeros_like(ids, dtype=torch.bool)
    else:
        hit = rows[pos.clamp(max=rows.numel() - 1)] == ids
    if not bool(hit.all()):
        missing = ids[~hit][:5].tolist()
        raise FrontierError(f"{what} has no row for storage ids {missing}")
    return pos


def _dst_view(
    spec, batch: LayerBatch, block: ConvBlock, features: Tensor, stored: dict
) -> Tensor | None:
    """Destination rows read in place: a view of the value's table, where the batch's
    destinations are a contiguous run of storage ids (a full layer), the value is stored
    for every node, float32, and the block writes into no tensor it did not create
    (:attr:`~hopserve.worker.trace.blocks.ConvBlock.writes_in_place`). ``None``: gather."""
    if spec.rows == SRC or batch.dst_start is None or block.writes_in_place:
        return None
    if spec.producer == FEATURES:
        table, rows = features, None
    else:
        table, rows = stored[spec.name]
    if rows is not None or table.dtype != torch.float32 or is_stand_in(table):
        return None
    return batch.dst_rows(table)  # a slice: the destinations are contiguous


@dataclass
class PreparedBatch:
    """A block and its inputs, ready to compute (on the device when CUDA)."""

    start: int
    end: int
    batch: LayerBatch
    inputs: list[Tensor]
    bytes_in: int  # accounted bytes known before compute
    event: object = None  # CUDA event marking the end of the host-to-device copy


def prepare(
    graph,
    split: ModelSplit,
    block: ConvBlock,
    frontier: LayerFrontier,
    start: int,
    end: int,
    stored: dict[str, tuple[Tensor, Tensor | None]],
    *,
    gather_free: bool,
    device: torch.device,
    copy_stream: torch.cuda.Stream | None,
    resident: DeviceGraph | None = None,
    whole_batches: dict[bool, LayerBatch] | None = None,
) -> PreparedBatch:
    """Build the block of rows ``start:end`` and gather its inputs.

    ``stored`` maps a value name to (tensor, its rows: ascending storage ids or ``None``
    for all nodes). Gather-free source inputs are the whole tables (no copy, no account).
    On CUDA the block is built, gathered and copied on ``copy_stream`` (so it overlaps the
    previous batch's compute) and ``event`` marks the end; feature rows come from the
    ``resident`` device copy of the graph when there is one. ``whole_batches`` (one run's)
    keeps the block of a full layer computed in one batch for the run's later full layers
    (the same edges: only the layer number differs), as a whole-graph forward keeps its
    graph; it holds what each such layer holds anyway.
    """
    on_stream = torch.cuda.stream(copy_stream) if copy_stream is not None else nullcontext()
    with on_stream:  # every device op below is queued on the copy stream
        whole = (
            whole_batches is not None
            and block.index > 0
            and frontier.nodes is None
            and not frontier.sampled
            and start == 0
            and end == graph.num_nodes
        )
        batch = whole_batches.get(gather_free) if whole else None
        if batch is not None:
            batch = batch.with_layer(block.index)  # shares the block and its caches
        else:
            batch = build_batch(
                graph, frontier, start, end, block.index, global_src=gather_free, resident=resident
            )
            if whole:
                whole_batches[gather_free] = batch
        features = resident.features if resident is not None else graph.features
        inputs, nbytes = [], 0
        for spec in block.inputs:
            if gather_free and spec.rows == SRC:  # the whole node table, no copy
                table = features if spec.producer == FEATURES else stored[spec.name][0]
                inputs.append(table)
                continue
            view = _dst_view(spec, batch, block, features, stored)
            if view is not None:  # the destinations' rows in place: nothing copied
                inputs.append(view)
                continue
            ids = batch.src_nodes if spec.rows == SRC else batch.dst_nodes
            if spec.producer == FEATURES:
                t = features.index_select(0, ids.to(features.device, non_blocking=True))
                if t.dtype == torch.float16:
                    t = t.float()
            else:
                tensor, rows = stored[spec.name]
                where = (
                    f"frontier V^{spec.producer}, which must hold the in-neighbours of V^{block.index},"
                    if spec.rows == SRC
                    else f"frontier V^{spec.producer}"
                )
                pos = row_positions(rows, ids, where)
                t = tensor.index_select(0, pos.to(tensor.device))
            nbytes += t.numel() * t.element_size()
            inputs.append(t)
        src_row_bytes = sum(
            t[0].numel() * t.element_size()
            for t, spec in zip(inputs, block.inputs, strict=True)
            if spec.rows == SRC and t.shape[0]
        )
        if gather_free:
            src_row_bytes = 0  # nothing gathered; fused SpMM reads the table in place
        per_edge = max(
            (split.adapters[c].edge_bytes(src_row_bytes) for c in block.convs), default=0
        )
        nbytes += batch.num_edges * (INDEX_BYTES_PER_EDGE + per_edge)
        if not gather_free:
            per_src = max(
                (split.adapters[c].src_bytes(src_row_bytes) for c in block.convs), default=0
            )
            nbytes += batch.num_src * per_src
        prepared = PreparedBatch(start, end, batch, inputs, nbytes)
        if copy_stream is not None:
            prepared.batch = batch.to(device, non_blocking=True)
            prepared.inputs = [
                t if t.device == device else t.pin_memory().to(device, non_blocking=True)
                for t in inputs
            ]
            event = torch.cuda.Event()
            event.record(copy_stream)
            prepared.event = event
        return prepared
