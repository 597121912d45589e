"""GraphTopology: a graph store's structure without its features (numpy only, no torch).

The front-end maps external IDs and plans frontiers on the topology alone: it opens the
CSC (``indptr``, ``indices``) and the ID map of a graph-store directory as copy-on-write
memmaps and never touches the features. :class:`~.store.GraphStore` (the worker's view,
torch) is built on the same arrays, zero-copy.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from hopserve.worker.graph.errors import GraphFormatError, UnknownNodeError
from hopserve.worker.graph.format import (
    EDGE_FEATURES_FILE,
    EDGE_TYPE_FILE,
    EDGE_WEIGHT_FILE,
    INDICES_FILE,
    INDPTR_FILE,
    NODE_IDS_FILE,
    TYPE_NODE_IDS_FILE,
    GraphMeta,
    load_array,
    read_meta,
)
from hopserve.worker.graph.ids import IdIndex

__all__ = ["GraphTopology", "as_id_array", "build_csr"]

log = logging.getLogger(__name__)


def as_id_array(ids: Any) -> np.ndarray:
    """Node IDs (int, sequence, numpy array or torch tensor) as an int64 numpy array.

    Raises:
        TypeError: not integers.
    """
    if hasattr(ids, "detach"):  # a torch tensor, without importing torch
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.size == 0 and arr.dtype.kind not in "iu":  # e.g. []
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"node IDs must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class GraphTopology:
    """CSC structure (in-edges grouped by destination) and the external ID map.

    Attributes:
        meta: The validated :class:`~.format.GraphMeta`.
        indptr: int64 ``[N+1]``; in-neighbours of storage node ``v`` are
            ``indices[indptr[v]:indptr[v+1]]`` (ascending).
        indices: int32 (``N < 2**31``) or int64 ``[E]``.
        node_ids: int64 ``[N]`` external ID per storage node, or ``None`` (identity).
        path: The directory it was opened from, or ``None`` when built in memory.
        edge_weight: float32 ``[E]`` per-edge weight in CSC order, or ``None``.
        edge_features: float32 ``[E, d_e]`` per-edge features in CSC order, or ``None``.
        edge_type: int16 ``[E]`` per-edge relation id in CSC order (names:
            ``meta.relations``), or ``None``.
        type_node_ids: int64 ``[N]`` each storage node's ID within its type (typed stores
            whose types have their own ID spaces), or ``None`` (positions ``0..count-1``).
    """

    def __init__(
        self,
        meta: GraphMeta,
        indptr: np.ndarray,
        indices: np.ndarray,
        node_ids: np.ndarray | None = None,
        path: str | Path | None = None,
        *,
        edge_weight: np.ndarray | None = None,
        edge_features: np.ndarray | None = None,
        edge_type: np.ndarray | None = None,
        type_node_ids: np.ndarray | None = None,
    ) -> None:
        self.meta = meta
        self.type_node_ids = type_node_ids
        self.indptr = indptr
        self.indices = indices
        self.node_ids = node_ids
        self.edge_weight = edge_weight
        self.edge_features = edge_features
        self.edge_type = edge_type
        self.path = None if path is None else Path(path)
        self._out_csr: tuple[np.ndarray, np.ndarray] | None = None  # set atomically, once
        self._out_lock = threading.Lock()  # one build, however many threads ask
        n, e = meta.num_nodes, meta.num_edges
        d_e = meta.edge_feature_dim
        where = str(self.path) if self.path else "graph"
        for ok, what in (
            (indptr.shape == (n + 1,), f"indptr shape {list(indptr.shape)}"),
            (indices.shape == (e,), f"indices shape {list(indices.shape)}"),
            (node_ids is None or node_ids.shape == (n,), "node_ids shape"),
            (int(indptr[0]) == 0 and int(indptr[-1]) == e, "indptr[0]/indptr[-1]"),
            (
                (edge_weight is None) != meta.has_edge_weight
                and (edge_weight is None or edge_weight.shape == (e,)),
                "edge_weight " + ("absent" if edge_weight is None else f"{[*edge_weight.shape]}"),
            ),
            (
                (edge_features is None) == (d_e is None)
                and (edge_features is None or edge_features.shape == (e, d_e)),
                "edge_features "
                + ("absent" if edge_features is None else f"{[*edge_features.shape]}"),
            ),
            (
                (edge_type is None) == (meta.relations is None)
                and (edge_type is None or edge_type.shape == (e,)),
                "edge_type " + ("absent" if edge_type is None else f"{[*edge_type.shape]}"),
            ),
            (
                (type_node_ids is None) != meta.has_type_node_ids
                and (type_node_ids is None or type_node_ids.shape == (n,)),
                "type_node_ids "
                + ("absent" if type_node_ids is None else f"{[*type_node_ids.shape]}"),
            ),
        ):
            if not ok:
                raise GraphFormatError(f"{where}: {what} inconsistent with meta (N={n}, E={e})")

    @classmethod
    def open(cls, path: str | Path, *, mmap: bool = True) -> GraphTopology:
        """Open the structure of a graph-store directory (features are not read).

        Raises:
            GraphFormatError: missing/invalid meta or arrays (the message names the file).
        """
        path = Path(path)
        if not path.is_dir():
            raise GraphFormatError(f"{path}: not a directory")
        meta = read_meta(path)
        n, e = meta.num_nodes, meta.num_edges
        indptr = load_array(path, INDPTR_FILE, mmap=mmap, dtype=np.int64, shape=(n + 1,))
        indices = load_array(
            path, INDICES_FILE, mmap=mmap, dtype=np.dtype(meta.indices_dtype), shape=(e,)
        )
        node_ids = (
            load_array(path, NODE_IDS_FILE, mmap=mmap, dtype=np.int64, shape=(n,))
            if meta.has_node_ids
            else None
        )
        edge_weight = (
            load_array(path, EDGE_WEIGHT_FILE, mmap=mmap, dtype=np.float32, shape=(e,))
            if meta.has_edge_weight
            else None
        )
        d_e = meta.edge_feature_dim
        edge_features = (
            load_array(path, EDGE_FEATURES_FILE, mmap=mmap, dtype=np.float32, shape=(e, d_e))
            if d_e is not None
            else None
        )
        edge_type = (
            load_array(path, EDGE_TYPE_FILE, mmap=mmap, dtype=np.int16, shape=(e,))
            if meta.relations is not None
            else None
        )
        type_node_ids = (
            load_array(path, TYPE_NODE_IDS_FILE, mmap=mmap, dtype=np.int64, shape=(n,))
            if meta.has_type_node_ids
            else None
        )
        return cls(
            meta,
            indptr,
            indices,
            node_ids,
            path,
            edge_weight=edge_weight,
            edge_features=edge_features,
            edge_type=edge_type,
            type_node_ids=type_node_ids,
        )

    # ------------------------------------------------------------------ sizes
    @property
    def num_nodes(self) -> int:
        return self.meta.num_nodes

    @property
    def num_edges(self) -> int:
        return self.meta.num_edges

    @property
    def has_edge_data(self) -> bool:
        """Whether the graph holds edge weights, edge features or edge types."""
        return any(c is not None for c in (self.edge_weight, self.edge_features, self.edge_type))

    @property
    def node_types(self) -> list[Any] | None:
        """The typed node sets (:class:`~.node_types.NodeTypeInfo`, id order), or ``None``."""
        return None if self.meta.node_types is None else list(self.meta.node_types)

    def node_type(self, name: str) -> Any:
        """The :class:`~.node_types.NodeTypeInfo` named ``name``.

        Raises:
            KeyError: no such type (naming the types there are).
        """
        for t in self.meta.node_types or []:
            if t.name == name:
                return t
        have = [t.name for t in self.meta.node_types or []]
        raise KeyError(f"no node type {name!r} (the graph's node types: {have or 'none'})")

    def typed_storage(self, ids: Any, node_type: str) -> np.ndarray:
        """IDs within ``node_type`` -> storage indices (see :meth:`find_typed`).

        Raises:
            KeyError: unknown type. UnknownNodeError: IDs the type does not have.
        """
        t = self.node_type(node_type)
        arr = as_id_array(ids)
        if self.type_node_ids is not None:
            return self._slot_storage(t, self._type_index(t.name).lookup(arr))
        bad = (arr < 0) | (arr >= t.count)
        if bad.any():
            raise UnknownNodeError(arr[bad], arr.size, int(bad.sum()))
        return self.to_storage(arr + t.offset)

    def find_typed(self, ids: Any, node_type: str) -> tuple[np.ndarray, np.ndarray]:
        """IDs within ``node_type`` -> ``(store-wide external IDs, found)`` (``-1`` where
        the type has no such ID). A type's IDs are its own when the store has them
        (:attr:`type_node_ids`), else its positions ``0..count-1``; the store-wide ID of
        position ``i`` is ``offset + i``.

        Raises:
            KeyError: unknown type.
        """
        t = self.node_type(node_type)
        arr = as_id_array(ids)
        if self.type_node_ids is None:
            found = (arr >= 0) & (arr < t.count)
            return np.where(found, arr + t.offset, -1), found
        slots, found = self._type_index(t.name).find(arr)
        out = np.full(arr.shape, -1, dtype=np.int64)
        out[found] = self.to_external(self._slot_storage(t, slots[found]))
        return out, found

    @staticmethod
    def _slot_storage(t: Any, slots: np.ndarray) -> np.ndarray:
        """Storage ids of a type's slots (what :meth:`_type_index` maps its own IDs to):
        slot ``s < count`` is storage id ``offset + s`` in the base range, slot
        ``count + j`` the type's ``j``-th added node."""
        slots = np.asarray(slots, dtype=np.int64)
        if not t.added:
            return slots + t.offset
        added = slots >= t.count
        out = slots + t.offset
        out[added] = t.added_ids(slots[added] - t.count)
        return out

    def build_type_indexes(self) -> None:
        """Build every type's own-ID lookup now (a store with :attr:`type_node_ids`), so
        the first typed request does not sort a type's IDs on the request path."""
        if self.type_node_ids is None:
            return
        for t in self.meta.node_types or ():
            self._type_index(t.name)

    def _type_index(self, name: str) -> IdIndex:
        """The lookup of one type's own IDs -> its slots (:meth:`_slot_storage`), built
        once (a live snapshot carries it over, extended by the nodes a batch adds)."""
        cache = self.__dict__.setdefault("_type_indexes", {})
        if name not in cache:
            t = self.node_type(name)
            own = t.entries(self.type_node_ids)
            try:
                cache[name] = IdIndex(np.asarray(own), t.total)
            except ValueError as e:
                where = self.path or "graph"
                raise GraphFormatError(f"{where}: type_node_ids of {name!r}: {e}") from None
        return cache[name]

    @property
    def relations(self) -> list[str] | None:
        """Relation names by id (the values of :attr:`edge_type`), or ``None``."""
        return None if self.meta.relations is None else list(self.meta.relations)

    @property
    def version(self) -> str:
        """Content-hash version id (changes with the data)."""
        return self.meta.version

    @property
    def ordering(self) -> str:
        """``"rcmk"`` or ``"identity"``."""
        return self.meta.ordering

    @property
    def avg_degree(self) -> float:
        """Average in-degree ``E / N`` (0 for an empty graph)."""
        return self.num_edges / self.num_nodes if self.num_nodes else 0.0

    @cached_property
    def in_degrees(self) -> np.ndarray:
        """int64 ``[N]``: number of in-edges of each storage node."""
        return np.diff(self.indptr)

    @cached_property
    def out_degrees(self) -> np.ndarray:
        """int64 ``[N]``: number of out-edges (occurrences as a source) of each node."""
        return np.bincount(self.indices, minlength=self.num_nodes).astype(np.int64, copy=False)

    @property
    def out_csr(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(out_indptr, out_indices)``: the CSR (out-edges by source, destinations
        ascending), once built (:meth:`ensure_out_edges`), else ``None``."""
        return self._out_csr

    @property
    def out_indptr(self) -> np.ndarray | None:
        """CSR offsets ``[N+1]`` (out-edges), once built."""
        return None if self._out_csr is None else self._out_csr[0]

    @property
    def out_indices(self) -> np.ndarray | None:
        """CSR destinations ``[E]``, ascending per source, once built."""
        return None if self._out_csr is None else self._out_csr[1]

    def ensure_out_edges(self) -> None:
        """Build the CSR once (``O(E log E)``; a living graph's later snapshots splice it)."""
        if self._out_csr is None:
            with self._out_lock:
                if self._out_csr is None:
                    self._out_csr = build_csr(self.indptr, self.indices, self.num_nodes)

    def out_neighbours(self, nodes: np.ndarray) -> np.ndarray:
        """Out-neighbours of storage ids ``nodes`` (concatenated, with repeats)."""
        from hopserve.worker.graph.planner import segment_positions

        self.ensure_out_edges()
        out_indptr, out_indices = self._out_csr
        pos, _ = segment_positions(out_indptr, np.asarray(nodes, dtype=np.int64))
        return out_indices[pos].astype(np.int64, copy=False)

    @cached_property
    def self_loop_counts(self) -> np.ndarray:
        """int64 ``[N]``: self-loops (edges ``v -> v``) of each node. ``O(E)`` once."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=self.indices.dtype), self.in_degrees)
        loops = dst[self.indices == dst]
        return np.bincount(loops, minlength=self.num_nodes).astype(np.int64, copy=False)

    def edge_index(self) -> np.ndarray:
        """int64 ``[2, E]`` edges in storage ids (row 0 source, row 1 destination), CSC order."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.in_degrees)
        return np.stack([self.indices.astype(np.int64), dst])

    # ------------------------------------------------------------------ IDs
    @cached_property
    def id_index(self) -> IdIndex:
        """The external ID -> storage index lookup (built on first use)."""
        try:
            return IdIndex(self.node_ids, self.num_nodes)
        except ValueError as e:
            raise GraphFormatError(f"{self.path or 'graph'}: node_ids: {e}") from None

    def to_storage(self, ids: Any) -> np.ndarray:
        """External IDs -> int64 storage indices, same shape.

        Raises:
            UnknownNodeError: some IDs are not in the graph (``.unknown`` lists them).
            TypeError: non-integer input.
        """
        return self.id_index.lookup(as_id_array(ids))

    def to_external(self, storage: Any) -> np.ndarray:
        """Storage indices -> int64 external IDs, same shape.

        Raises:
            IndexError: an index is outside ``0..N-1``.
        """
        idx = as_id_array(storage)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_nodes):
            bad = idx[(idx < 0) | (idx >= self.num_nodes)].reshape(-1)[:10].tolist()
            raise IndexError(f"storage indices out of range 0..{self.num_nodes - 1}: {bad}")
        return idx.copy() if self.node_ids is None else np.asarray(self.node_ids[idx])

    @cached_property
    def sorted_external_order(self) -> np.ndarray:
        """Storage indices ordered by ascending external ID (``arange`` for identity)."""
        return self.id_index.sorted_order()

    def __repr__(self) -> str:
        where = f", path='{self.path}'" if self.path else ""
        return (
            f"GraphTopology(nodes={self.num_nodes:,}, edges={self.num_edges:,}, "
            f"ordering={self.ordering}, version={self.version[:12]}{where})"
        )


def build_csr(indptr: np.ndarray, indices: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (out-edges grouped by source, destinations ascending) of a CSC. ``O(E log E)``."""
    dst = np.repeat(np.arange(n, dtype=indices.dtype), np.diff(indptr))
    order = np.argsort(indices, kind="stable")  # by source; destinations stay ascending
    out_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(indices, minlength=n), out=out_indptr[1:])
    return out_indptr, dst[order]
