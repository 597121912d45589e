"""GraphSnapshot: the topology of a living graph at one sequence, and how a batch makes the next.

A snapshot is a :class:`~hopserve.worker.graph.topology.GraphTopology` (so the planner,
ID mapping and the engine read it unchanged) whose arrays are never modified: applying a
batch builds the next snapshot (:func:`apply_batch`) and readers holding the old one keep
a consistent view. The cost of a batch is one copy of the CSC (``O(N + E)`` memory
traffic, no sort of the graph): the in-edge segments of the destinations it touches are
rebuilt, every other segment is copied as one slice per run of untouched nodes. Degrees
and the ID index are carried over incrementally, not recomputed. With ``track_out_edges``
the CSR (out-edges, for cache invalidation) is spliced the same way, and the edge columns
(``edge_weight``, ``edge_features``, CSC order) along with the CSC: a kept edge keeps its
values, an added edge takes the batch's, a removed edge's values go with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from hopserve.worker.graph.errors import UnknownNodeError
from hopserve.worker.graph.format import (
    EDGE_FEATURES_FILE,
    EDGE_TYPE_FILE,
    EDGE_WEIGHT_FILE,
    NODES_ADDED_FORMAT_VERSION,
    TYPE_NODE_IDS_FILE,
    GraphMeta,
    indices_dtype_for,
    load_array,
)
from hopserve.worker.graph.ids import IdIndex
from hopserve.worker.graph.live.mutations import InvalidUpdateError, ResolvedBatch
from hopserve.worker.graph.planner import segment_positions
from hopserve.worker.graph.topology import GraphTopology, build_csr

__all__ = ["GraphSnapshot", "LiveIdIndex", "apply_batch", "build_csr", "splice_csc"]


class LiveIdIndex:
    """The base graph's :class:`~hopserve.worker.graph.ids.IdIndex` plus added nodes."""

    def __init__(self, base: IdIndex, new_ids: np.ndarray, first_new: int) -> None:
        self.base = base
        self.num_nodes = first_new + new_ids.size
        self._new_ids = new_ids  # external IDs of storage ids first_new, first_new + 1, ...
        self._first_new = first_new
        order = np.argsort(new_ids, kind="stable")
        self._sorted, self._order = new_ids[order], order + first_new

    def extended(self, more: np.ndarray) -> LiveIdIndex:
        """This index with nodes ``more`` appended (storage ids ``num_nodes, …``)."""
        return LiveIdIndex(self.base, np.concatenate([self._new_ids, more]), self._first_new)

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(storage, found)`` as :meth:`IdIndex.find`."""
        storage, found = self.base.find(ids)
        if self._sorted.size and not found.all():
            miss = np.flatnonzero(~found)
            pos = np.minimum(np.searchsorted(self._sorted, ids[miss]), self._sorted.size - 1)
            hit = self._sorted[pos] == ids[miss]
            storage[miss[hit]] = self._order[pos[hit]]
            found[miss[hit]] = True
        return storage, found

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """External IDs -> storage ids. Raises ``UnknownNodeError``."""
        ids = np.asarray(ids, dtype=np.int64)
        storage, found = self.find(ids)
        if not found.all():
            missing = ~found
            raise UnknownNodeError(ids[missing], ids.size, int(missing.sum()))
        return storage

    def external(self) -> np.ndarray:
        """External ID of every storage node."""
        base = self.base.sorted_order()  # storage ids by ascending external ID
        ext = np.empty(self._first_new, dtype=np.int64)
        if self.base.kind == "identity":
            ext[:] = np.arange(self._first_new)
        elif self.base.kind == "dense":
            ext[base] = np.arange(self._first_new)
        else:
            ext[base] = self.base._sorted
        return np.concatenate([ext, self._new_ids])

    def sorted_order(self) -> np.ndarray:
        """Storage ids by ascending external ID."""
        return np.argsort(self.external(), kind="stable")


class GraphSnapshot(GraphTopology):
    """The topology at graph sequence :attr:`seq` (see the module docstring).

    Attributes (besides :class:`GraphTopology`'s):
        seq: Graph sequence (0 = the base store).
        base_version: Version of the base store; ``version`` is ``base_version`` at
            sequence 0 and ``"{base_version}+{seq}"`` after (unique per sequence).
        out_indptr, out_indices: The CSR (out-neighbours, ascending), when tracked.
    """

    def __init__(
        self,
        meta: GraphMeta,
        indptr: np.ndarray,
        indices: np.ndarray,
        node_ids: np.ndarray | None,
        path,
        *,
        seq: int,
        base_version: str,
        id_index: IdIndex | LiveIdIndex | None = None,
        in_degrees: np.ndarray | None = None,
        out_degrees: np.ndarray | None = None,
        out_csr: tuple[np.ndarray, np.ndarray] | None = None,
        self_loops: np.ndarray | None = None,
        edge_weight: np.ndarray | None = None,
        edge_features: np.ndarray | None = None,
        edge_type: np.ndarray | None = None,
        type_node_ids: np.ndarray | None = None,
    ) -> None:
        if path is not None and edge_weight is None and edge_features is None and edge_type is None:
            # A base store's columns, mapped from its folder (not passed by every caller).
            edge_weight, edge_features, edge_type = _edge_columns(meta, path)
        if path is not None and type_node_ids is None and meta.has_type_node_ids:
            type_node_ids = load_array(path, TYPE_NODE_IDS_FILE, dtype=np.int64)
        super().__init__(
            meta, indptr, indices, node_ids, path,
            edge_weight=edge_weight, edge_features=edge_features, edge_type=edge_type,
            type_node_ids=type_node_ids,
        )  # fmt: skip
        self.seq = int(seq)
        self.base_version = base_version
        if id_index is not None:
            self.__dict__["id_index"] = id_index
        if in_degrees is not None:
            self.__dict__["in_degrees"] = in_degrees
        if out_degrees is not None:
            self.__dict__["out_degrees"] = out_degrees
        if self_loops is not None:
            self.__dict__["self_loop_counts"] = self_loops
        self._out_csr = out_csr  # one attribute: set atomically (a thread may build it)

    @classmethod
    def of(cls, topology: GraphTopology) -> GraphSnapshot:
        """Sequence 0: the base store's own topology."""
        return cls(
            topology.meta, topology.indptr, topology.indices, topology.node_ids, topology.path,
            seq=0, base_version=topology.version,
            edge_weight=topology.edge_weight, edge_features=topology.edge_features,
            edge_type=topology.edge_type, type_node_ids=topology.type_node_ids,
        )  # fmt: skip

    @property
    def feature_dim(self) -> int:
        """Feature width."""
        return self.meta.feature_dim

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(storage, found)`` of external IDs (``-1`` where unknown)."""
        return self.id_index.find(np.asarray(ids, dtype=np.int64))

    def has_edges(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """bool ``[k]``: whether ``src[i] -> dst[i]`` is an edge (storage ids)."""
        out = np.zeros(src.size, dtype=bool)
        for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            seg = self.indices[self.indptr[d] : self.indptr[d + 1]]
            j = np.searchsorted(seg, s)
            out[i] = j < seg.size and seg[j] == s
        return out

    @cached_property
    def sorted_external_order(self) -> np.ndarray:
        return self.id_index.sorted_order()


def _edge_columns(meta: GraphMeta, path) -> tuple[np.ndarray | None, ...]:  # noqa: ANN001
    """``(weight, features, type)``: the edge columns ``meta`` says the store at ``path``
    holds (memory-mapped), ``None`` for the others."""
    e, d_e = meta.num_edges, meta.edge_feature_dim
    weight = features = types = None
    if meta.has_edge_weight:
        weight = load_array(path, EDGE_WEIGHT_FILE, dtype=np.float32, shape=(e,))
    if d_e is not None:
        features = load_array(path, EDGE_FEATURES_FILE, dtype=np.float32, shape=(e, d_e))
    if meta.relations is not None:
        types = load_array(path, EDGE_TYPE_FILE, dtype=np.int16, shape=(e,))
    return weight, features, types


def splice_csc(
    indptr: np.ndarray,
    indices: np.ndarray,
    n_after: int,
    remove_rows: np.ndarray,
    remove_cols: np.ndarray,
    add_rows: np.ndarray,
    add_cols: np.ndarray,
    columns: Sequence[tuple[np.ndarray, np.ndarray]] = (),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """A compressed adjacency with every ``(row, col)`` of ``remove_*`` taken out (all
    copies) and ``add_*`` put in; rows beyond the old ones are new, empty rows.

    Only the touched rows are rebuilt (columns ascending; among equal entries the kept ones
    first, then the added ones in the order given); the rest is copied in runs.

    Args:
        columns: ``(old, added)`` per-entry value arrays spliced with the entries:
            ``old`` aligned with ``indices`` (``[E, ...]``), ``added`` with ``add_rows``.

    Returns:
        ``(indptr, indices, removed_cols, spliced)``: the new arrays, the column of every
        entry that was removed (one per copy; for degree bookkeeping), and each of
        ``columns`` aligned with the new ``indices`` (a kept entry's value, an added
        entry's own, a removed entry's dropped).
    """
    n_before = indptr.size - 1
    dtype = indices_dtype_for(n_after)
    rows = np.unique(np.concatenate([remove_rows, add_rows]).astype(np.int64))
    if rows.size == 0:  # no edge changes: new rows are empty
        new_indptr = np.concatenate([indptr, np.full(n_after - n_before, indptr[-1])])
        return (
            new_indptr, indices.astype(dtype, copy=False), np.empty(0, dtype=np.int64),
            [old for old, _ in columns],
        )  # fmt: skip
    old_rows = rows[rows < n_before]
    pos, counts = segment_positions(indptr, old_rows)
    seg_rows = np.repeat(old_rows, counts)
    seg_cols = indices[pos].astype(np.int64)
    removed_cols = np.empty(0, dtype=np.int64)
    if remove_rows.size:
        scale = np.int64(max(n_after, 1))
        gone = np.isin(seg_rows * scale + seg_cols, remove_rows * scale + remove_cols)
        removed_cols = seg_cols[gone]
        seg_rows, seg_cols, pos = seg_rows[~gone], seg_cols[~gone], pos[~gone]
    all_rows = np.concatenate([seg_rows, add_rows.astype(np.int64)])
    all_cols = np.concatenate([seg_cols, add_cols.astype(np.int64)])
    order = np.lexsort((all_cols, all_rows))  # stable: kept entries before added ones
    all_rows, all_cols = all_rows[order], all_cols[order]
    # each column's rebuilt-row values, in the same order as all_cols
    all_vals = [np.concatenate([old[pos], added.astype(old.dtype, copy=False)])[order]
                for old, added in columns]  # fmt: skip
    counts_new = np.zeros(n_after, dtype=np.int64)
    counts_new[:n_before] = np.diff(indptr)
    counts_new[rows] = np.bincount(all_rows, minlength=n_after)[rows]
    new_indptr = np.zeros(n_after + 1, dtype=np.int64)
    np.cumsum(counts_new, out=new_indptr[1:])
    parts: list[np.ndarray] = []
    val_parts: list[list[np.ndarray]] = [[] for _ in columns]

    def copy_run(lo: int, hi: int) -> None:  # old entries lo..hi-1, unchanged
        parts.append(indices[lo:hi])
        for out, (old, _) in zip(val_parts, columns, strict=True):
            out.append(old[lo:hi])

    prev = 0  # first old row not copied yet
    rebuilt = np.searchsorted(all_rows, rows)  # where each touched row's entries start
    ends = np.append(rebuilt[1:], all_rows.size)
    for r, a, b in zip(rows.tolist(), rebuilt.tolist(), ends.tolist(), strict=True):
        stop = min(r, n_before)
        if stop > prev:
            copy_run(int(indptr[prev]), int(indptr[stop]))
        parts.append(all_cols[a:b])
        for out, vals in zip(val_parts, all_vals, strict=True):
            out.append(vals[a:b])
        prev = max(prev, r + 1) if r < n_before else n_before
    if prev < n_before:
        copy_run(int(indptr[prev]), int(indptr[n_before]))
    new_indices = (
        np.concatenate([p.astype(dtype, copy=False) for p in parts])
        if parts
        else np.empty(0, dtype=dtype)
    )
    spliced = [
        np.concatenate(out) if out else old[:0].copy()
        for out, (old, _) in zip(val_parts, columns, strict=True)
    ]
    return new_indptr, new_indices, removed_cols, spliced


def apply_batch(snap: GraphSnapshot, batch: ResolvedBatch) -> GraphSnapshot:
    """The snapshot after ``batch`` (``snap`` is left untouched); the edge columns are
    spliced with the CSC (see the module docstring).

    Raises:
        InvalidUpdateError: the batch's edge data does not match the graph's edge columns
            (:func:`~.mutations.resolve` refuses that first; this guards against splicing
            the CSC without its columns, e.g. a record resolved against another graph).
    """
    columns = _edge_data(snap, batch)
    n_before = snap.num_nodes
    k = batch.new_node_ids.size
    n = n_before + k
    indptr, indices, removed_src, spliced = splice_csc(
        snap.indptr, snap.indices, n,
        batch.remove_dst, batch.remove_src, batch.add_dst, batch.add_src,
        [(old, added) for _, old, added in columns],
    )  # fmt: skip
    edge_cols = {name: None for name in ("edge_weight", "edge_features", "edge_type")}
    edge_cols.update((name, values) for (name, _, _), values in zip(columns, spliced, strict=True))
    in_deg = np.diff(indptr)
    out_deg = np.zeros(n, dtype=np.int64)
    out_deg[:n_before] = snap.out_degrees
    out_deg += np.bincount(batch.add_src, minlength=n)
    out_deg -= np.bincount(removed_src, minlength=n)
    out_csr = None
    old_csr = snap.out_csr
    if old_csr is not None:
        o_ptr, o_idx, _, _ = splice_csc(
            old_csr[0], old_csr[1], n,
            batch.remove_src, batch.remove_dst, batch.add_src, batch.add_dst,
        )  # fmt: skip
        out_csr = (o_ptr, o_idx)
    self_loops = None
    if "self_loop_counts" in snap.__dict__:  # carried over when the old one was counted
        self_loops = np.zeros(n, dtype=np.int64)
        self_loops[:n_before] = snap.self_loop_counts
        gone = batch.remove_src == batch.remove_dst  # every copy of each removed loop
        self_loops[batch.remove_dst[gone]] = 0
        added = batch.add_src == batch.add_dst  # removals come first in a batch
        self_loops += np.bincount(batch.add_dst[added], minlength=n)
    index = snap.id_index
    node_ids = snap.node_ids
    if k:
        index = (
            index.extended(batch.new_node_ids)
            if isinstance(index, LiveIdIndex)
            else LiveIdIndex(index, batch.new_node_ids, n_before)
        )
        base_ids = np.arange(n_before, dtype=np.int64) if node_ids is None else node_ids
        node_ids = np.concatenate([base_ids, batch.new_node_ids])
    typed, type_node_ids = _typed_nodes(snap, batch) if k else ({}, snap.type_node_ids)
    meta = snap.meta.model_copy(
        update={
            "num_nodes": n,
            "num_edges": int(indptr[-1]),
            "indices_dtype": indices_dtype_for(n).name,
            "version": f"{snap.base_version}+{batch.seq}",
            "has_node_ids": node_ids is not None,
            "has_labels": False,
            "num_classes": None,
            **typed,
        }
    )
    out = GraphSnapshot(
        meta, indptr, indices, node_ids, snap.path,
        seq=batch.seq, base_version=snap.base_version, id_index=index,
        in_degrees=in_deg, out_degrees=out_deg, out_csr=out_csr, self_loops=self_loops,
        edge_weight=edge_cols["edge_weight"], edge_features=edge_cols["edge_features"],
        edge_type=edge_cols["edge_type"],
        type_node_ids=type_node_ids,
    )  # fmt: skip
    if "_type_indexes" in snap.__dict__:  # the same IDs, and a batch's own: carried over
        indexes = dict(snap.__dict__["_type_indexes"])
        if typed:
            t = snap.meta.node_types[int(batch.new_node_type[0])]
            if t.name in indexes:
                old = indexes[t.name]
                indexes[t.name] = (
                    old.extended(batch.new_type_node_ids)
                    if isinstance(old, LiveIdIndex)
                    else LiveIdIndex(old, batch.new_type_node_ids, t.total)
                )
        out.__dict__["_type_indexes"] = indexes
    return out


def _typed_nodes(snap: GraphSnapshot, batch: ResolvedBatch) -> tuple[dict, np.ndarray | None]:
    """``(meta fields, type_node_ids)`` of a typed graph after ``batch`` appends its new
    nodes as a run of their type; ``({}, None)`` on an untyped graph.

    Raises:
        InvalidUpdateError: the batch's new nodes lack their type on a typed graph, or
            carry one on an untyped graph (a record resolved against another graph).
    """
    types = snap.meta.node_types
    k = batch.new_node_ids.size
    has_type = batch.new_node_type is not None and batch.new_type_node_ids is not None
    if types is None and not has_type:
        return {}, None
    if types is None or not has_type or snap.type_node_ids is None:
        raise InvalidUpdateError(
            f"batch {batch.seq} adds {k} node(s) "
            + ("with a node type to an untyped graph" if types is None else "without own IDs")
        )
    index = int(batch.new_node_type[0])
    if not 0 <= index < len(types) or batch.new_type_node_ids.size != k:
        raise InvalidUpdateError(
            f"batch {batch.seq}: node type {index} with {batch.new_type_node_ids.size} IDs "
            f"for {k} new node(s) (the graph has {len(types)} types)"
        )
    types = list(types)
    types[index] = types[index].with_added(snap.num_nodes, k)
    own_ids = np.concatenate([np.asarray(snap.type_node_ids), batch.new_type_node_ids])
    return {"node_types": types, "format_version": NODES_ADDED_FORMAT_VERSION}, own_ids


def _edge_data(
    snap: GraphSnapshot, batch: ResolvedBatch
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(column, values in CSC order, values of the added edges)`` per edge column the
    graph holds. Raises :class:`InvalidUpdateError` when the batch's edge data does not
    match those columns."""
    out = []
    k = batch.add_src.size
    for name, field, old in (
        ("edge_weight", "add_edge_weight", snap.edge_weight),
        ("edge_features", "add_edge_features", snap.edge_features),
        ("edge_type", "add_edge_type", snap.edge_type),
    ):
        added = getattr(batch, field)
        if old is None:
            if added is not None:
                raise InvalidUpdateError(
                    f"batch {batch.seq} carries {field}, the graph holds no {name} column"
                )
            continue
        if added is None and k:
            raise InvalidUpdateError(
                f"batch {batch.seq} adds {k} edge(s) without {field}; the graph holds {name}"
            )
        if added is None:
            added = old[:0]
        if added.dtype.kind != old.dtype.kind or (
            old.dtype.kind in "iu"
            and added.size
            and (int(added.min()) < 0 or int(added.max()) >= len(snap.meta.relations or []))
        ):
            raise InvalidUpdateError(
                f"batch {batch.seq}: {field} holds {added.dtype} values that {name} "
                f"({old.dtype}) cannot take"
            )
        added = added.astype(old.dtype, copy=False)  # a log record holds int64 ids
        if added.shape[0] != k or added.shape[1:] != old.shape[1:]:
            raise InvalidUpdateError(
                f"batch {batch.seq}: {field} has shape {list(added.shape)}, expected "
                f"{[k, *old.shape[1:]]}"
            )
        out.append((name, old, added))
    return out
