"""Store contents: a CSC paired with features, labels and external IDs, to materialize or write.

A :class:`StoreContents` holds everything a graph store holds, in storage order, except that
feature rows are still to be read from a :class:`FeatureSource` (so features never have to
fit in memory). :func:`materialize` builds the arrays in memory; :func:`write_contents` streams
them into a graph-store directory atomically (:mod:`~.atomic`). Both hash the same bytes
in the same order into the version id (:mod:`~.version`), so an in-memory store and its
saved copy share one version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hopserve.worker.graph.atomic import atomic_directory
from hopserve.worker.graph.build import (
    CSC,
    Ordering,
    validate_edge_features,
    validate_edge_weight,
    validate_labels,
    validate_node_ids,
)
from hopserve.worker.graph.format import (
    EDGE_FEATURES_FILE,
    EDGE_FORMAT_VERSION,
    EDGE_TYPE_FILE,
    EDGE_WEIGHT_FILE,
    FEATURES_FILE,
    FORMAT_VERSION,
    INDICES_FILE,
    INDPTR_FILE,
    LABELS_FILE,
    NODE_IDS_FILE,
    NODES_ADDED_FORMAT_VERSION,
    TYPE_IDS_FORMAT_VERSION,
    TYPE_NODE_IDS_FILE,
    TYPED_FORMAT_VERSION,
    GraphFlags,
    GraphMeta,
    utc_now,
    write_meta,
)
from hopserve.worker.graph.progress import progress_bar
from hopserve.worker.graph.relations import EDGE_TYPE_DTYPE, relation_ids
from hopserve.worker.graph.version import VersionHasher

__all__ = [
    "FeatureSource",
    "ArrayFeatures",
    "StoreContents",
    "GraphArrays",
    "contents_from_csc",
    "materialize",
    "write_contents",
]

log = logging.getLogger(__name__)

_CHUNK_BYTES = 32 << 20  # feature bytes copied / hashed per step


class FeatureSource(Protocol):
    """Feature rows read in chunks (so features never have to fit in memory).

    ``read(rows)`` gets a slice or an int64 index array of SOURCE rows and returns a
    ``[len, dim]`` array of dtype :attr:`dtype`.
    """

    @property
    def num_rows(self) -> int: ...

    @property
    def dim(self) -> int: ...

    @property
    def dtype(self) -> np.dtype: ...

    def read(self, rows: slice | np.ndarray) -> np.ndarray: ...


class ArrayFeatures:
    """A :class:`FeatureSource` over an array or memmap ``[N, F]``; float64 becomes float32."""

    def __init__(self, array: np.ndarray) -> None:
        if array.ndim != 2:
            raise ValueError(f"features must be 2-D [N, F], got shape {list(array.shape)}")
        if array.dtype in (np.float32, np.float16):
            self._dtype = array.dtype
        elif array.dtype == np.float64:
            self._dtype = np.dtype(np.float32)
        else:
            raise ValueError(f"features must be float32/float16 (or float64), got {array.dtype}")
        self.array = array

    @property
    def num_rows(self) -> int:
        return self.array.shape[0]

    @property
    def dim(self) -> int:
        return self.array.shape[1]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._dtype)

    def read(self, rows: slice | np.ndarray) -> np.ndarray:
        if isinstance(rows, slice):
            out = self.array[rows]
        else:  # gather in ascending row order (sequential on disk), then undo the sort
            order = np.argsort(rows, kind="stable")
            out = np.empty((rows.size, self.dim), dtype=self.array.dtype)
            out[order] = self.array[rows[order]]
        return out.astype(self._dtype, copy=False)

    def as_storage_array(self) -> np.ndarray | None:
        """The array itself when it can be used as storage-order features without a copy."""
        a = self.array
        ok = a.dtype == self._dtype and a.flags.c_contiguous and not isinstance(a, np.memmap)
        return a if ok else None


@dataclass
class StoreContents:
    """Everything a graph store holds, in storage order, with features still to be read.

    Feature row of storage node ``s`` is ``features.read(feature_perm[s])`` (or row ``s``
    when ``feature_perm`` is ``None``). Edge columns are in CSC order (entry ``k`` belongs
    to the edge at ``indices[k]``).
    """

    indptr: np.ndarray
    indices: np.ndarray
    features: FeatureSource
    feature_perm: np.ndarray | None
    node_ids: np.ndarray | None
    labels: np.ndarray | None
    ordering: Ordering
    flags: GraphFlags
    edge_weight: np.ndarray | None = None  # float32 [E]
    edge_features: np.ndarray | None = None  # float32 [E, d_e]
    edge_type: np.ndarray | None = None  # int16 [E] relation ids
    relations: list[str] | None = None  # relation names by id (with edge_type)
    node_types: list[Any] | None = None  # NodeTypeInfo per type, in id order
    type_node_ids: np.ndarray | None = None  # int64 [N]: each node's ID within its type

    @property
    def num_nodes(self) -> int:
        return self.indptr.size - 1

    @property
    def has_edge_data(self) -> bool:
        return any(c is not None for c in (self.edge_weight, self.edge_features, self.edge_type))

    def header(self) -> dict[str, Any]:
        """The meta fields that are part of the content hash (all but version/created_at)."""
        labels = self.labels
        num_classes = None
        if labels is not None:
            num_classes = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 0
        return {
            "format_version": FORMAT_VERSION,
            "num_nodes": self.num_nodes,
            "num_edges": int(self.indices.size),
            "feature_dim": int(self.features.dim),
            "feature_dtype": np.dtype(self.features.dtype).name,
            "indices_dtype": np.dtype(self.indices.dtype).name,
            "ordering": self.ordering,
            "flags": self.flags.model_dump(),
            "has_node_ids": self.node_ids is not None,
            "has_labels": labels is not None,
            "num_classes": num_classes,
        } | self._edge_header()

    def _edge_header(self) -> dict[str, Any]:
        """Edge-column fields (format version 2); none for a store without them, so its
        meta and content hash are those of format version 1."""
        if not self.has_edge_data:
            return {}
        ef = self.edge_features
        fields: dict[str, Any] = {
            "format_version": EDGE_FORMAT_VERSION,
            "has_edge_weight": self.edge_weight is not None,
            "edge_feature_dim": None if ef is None else int(ef.shape[1]),
        }
        if self.edge_type is not None:  # absent otherwise: older stores hash as before
            fields["relations"] = list(self.relations or [])
        if self.node_types is not None:
            fields["format_version"] = TYPED_FORMAT_VERSION
            fields["node_types"] = [t.model_dump() for t in self.node_types]
        if self.type_node_ids is not None:  # absent otherwise: v3 stores hash as before
            fields["format_version"] = TYPE_IDS_FORMAT_VERSION
            fields["has_type_node_ids"] = True
            if any(t.added for t in self.node_types or ()):  # nodes live updates added
                fields["format_version"] = NODES_ADDED_FORMAT_VERSION
        return fields

    def feature_chunks(self, *, progress: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first storage row, rows)`` in storage order, ~32 MiB at a time."""
        n, f = self.num_nodes, self.features.dim
        step = max(1, _CHUNK_BYTES // max(1, f * self.features.dtype.itemsize))
        with progress_bar(total=n, desc="features", unit="row", enabled=progress) as bar:
            for start in range(0, n, step):
                stop = min(n, start + step)
                if self.feature_perm is None:
                    rows = self.features.read(slice(start, stop))
                else:
                    rows = self.features.read(self.feature_perm[start:stop])
                yield start, rows
                bar.update(stop - start)

    def _hash_static(self) -> VersionHasher:
        h = VersionHasher(self.header())
        h.array("indptr", self.indptr)
        h.array("indices", self.indices)
        h.array("node_ids", self.node_ids)
        h.array("labels", self.labels)
        if self.has_edge_data:
            h.array("edge_weight", self.edge_weight)
            h.array("edge_features", self.edge_features)
            if self.edge_type is not None:
                h.array("edge_type", self.edge_type)
            if self.type_node_ids is not None:
                h.array("type_node_ids", self.type_node_ids)
        h.begin("features", self.features.dtype, (self.num_nodes, self.features.dim))
        return h


def contents_from_csc(
    csc: CSC,
    features: FeatureSource | np.ndarray,
    *,
    labels: np.ndarray | None = None,
    node_ids: np.ndarray | None = None,
    features_in_storage_order: bool = False,
    edge_weight: np.ndarray | None = None,
    edge_features: np.ndarray | None = None,
    edge_type: np.ndarray | None = None,
    relations: list[str] | None = None,
    node_types: list[Any] | None = None,
    type_node_ids: np.ndarray | None = None,
) -> StoreContents:
    """Pair a CSC with features/labels/external IDs given in INPUT order.

    External IDs in storage order are ``node_ids[perm]``; without ``node_ids`` they are the
    input indices ``perm`` (so callers keep their numbering), and ``None`` for identity.
    ``features_in_storage_order`` says the source already yields rows in storage order.
    ``edge_weight`` ``[E]`` / ``edge_features`` ``[E, d_e]`` are given per INPUT edge and
    follow their edges into CSC order (the CSC must be built with ``track_edges``), as
    does ``edge_type`` ``[E]`` (relation ids or names, see
    :func:`~.relations.relation_ids`; ``relations`` names them). ``node_types``
    (:class:`~.node_types.NodeTypeInfo` per type, input id ranges) must be kept by the
    CSC's permutation (built with ``node_groups``); ``type_node_ids`` ``[N]`` (per input
    node, its ID within its type: :func:`~.node_types.check_type_node_ids`) follow it.

    Raises:
        ValueError: bad shapes or values (naming the first bad row or edge).
    """
    n = csc.num_nodes
    src = features if not isinstance(features, np.ndarray) else ArrayFeatures(features)
    if src.num_rows != n:
        raise ValueError(f"features have {src.num_rows} rows, graph has {n} nodes")
    perm = csc.perm
    if labels is not None:
        labels = validate_labels(labels, n)
        labels = labels if perm is None else labels[perm]
    if node_ids is not None:
        node_ids = validate_node_ids(node_ids, n)
        node_ids = node_ids if perm is None else node_ids[perm]
    elif perm is not None:
        node_ids = perm
    if edge_type is not None:
        edge_type, relations = relation_ids(edge_type, relations)
    elif relations is not None:
        raise ValueError("relations names the values of edge_type, which is missing")
    if edge_weight is not None or edge_features is not None or edge_type is not None:
        order = csc.edge_order
        if order is None:
            raise ValueError("edge data needs a CSC built with track_edges=True")
        given = csc.stats.input_edges  # symmetrize's reverse edges reuse their mirror's rows
        if edge_weight is not None:
            edge_weight = validate_edge_weight(edge_weight, given)[order]
        if edge_features is not None:
            edge_features = validate_edge_features(edge_features, given)[order]
        if edge_type is not None:
            if edge_type.size != given:
                raise ValueError(
                    f"edge_type must have shape [{given}] (one relation id per edge), "
                    f"got [{edge_type.size}]"
                )
            edge_type = edge_type[order]
    if type_node_ids is not None:
        from hopserve.worker.graph.node_types import check_type_node_ids

        if node_types is None:
            raise ValueError("type_node_ids are the IDs within node types, which are missing")
        type_node_ids = check_type_node_ids(type_node_ids, node_types)
        type_node_ids = type_node_ids if perm is None else type_node_ids[perm]
    return StoreContents(
        indptr=csc.indptr,
        indices=csc.indices,
        features=src,
        feature_perm=None if features_in_storage_order else perm,
        node_ids=node_ids,
        labels=labels,
        ordering=csc.ordering,
        flags=csc.flags,
        edge_weight=edge_weight,
        edge_features=edge_features,
        edge_type=edge_type,
        relations=relations,
        node_types=_kept_node_types(node_types, perm),
        type_node_ids=type_node_ids,
    )


def _kept_node_types(node_types: list[Any] | None, perm: np.ndarray | None) -> list[Any] | None:
    """``node_types`` when the permutation keeps every type's id range, else raise."""
    if node_types is None or perm is None:
        return node_types
    for t in node_types:
        for first, count in t.ranges:
            moved = perm[first : first + count]
            if moved.size and (moved.min() < first or moved.max() >= first + count):
                break
        else:
            continue
        raise ValueError(
            f"the node order moves node type {t.name!r} out of its ranges (build the CSC "
            "with node_groups)"
        )
    return node_types


@dataclass
class GraphArrays:
    """A graph store's arrays in memory (storage order) and its meta."""

    meta: GraphMeta
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    node_ids: np.ndarray | None
    labels: np.ndarray | None
    edge_weight: np.ndarray | None = None
    edge_features: np.ndarray | None = None
    edge_type: np.ndarray | None = None
    type_node_ids: np.ndarray | None = None


def materialize(contents: StoreContents, *, progress: bool = False) -> GraphArrays:
    """Build the arrays in memory; features are not copied when already usable as-is."""
    h = contents._hash_static()
    direct = None
    if contents.feature_perm is None and isinstance(contents.features, ArrayFeatures):
        direct = contents.features.as_storage_array()
    if direct is not None:
        feats = direct
        step = max(1, _CHUNK_BYTES // max(1, feats.shape[1] * feats.itemsize))
        for start in range(0, feats.shape[0], step):
            h.feed(feats[start : start + step])
    else:
        feats = np.empty((contents.num_nodes, contents.features.dim), dtype=contents.features.dtype)
        for start, rows in contents.feature_chunks(progress=progress):
            feats[start : start + rows.shape[0]] = rows
            h.feed(rows)
    meta = GraphMeta(**contents.header(), version=h.hexdigest(), created_at=utc_now())
    return GraphArrays(
        meta,
        contents.indptr,
        contents.indices,
        feats,
        contents.node_ids,
        contents.labels,
        contents.edge_weight,
        contents.edge_features,
        contents.edge_type,
        contents.type_node_ids,
    )


def _save(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)


def write_contents(
    out: str | Path, contents: StoreContents, *, overwrite: bool = False, progress: bool = True
) -> GraphMeta:
    """Write a graph-store directory atomically (see :mod:`~.atomic`); return its meta.

    Raises:
        FileExistsError: ``out`` exists, is not empty and ``overwrite`` is false.
    """
    t0 = time.perf_counter()
    with atomic_directory(out, overwrite=overwrite) as tmp:
        h = contents._hash_static()
        _save(tmp / INDPTR_FILE, contents.indptr)
        _save(tmp / INDICES_FILE, contents.indices)
        if contents.node_ids is not None:
            _save(tmp / NODE_IDS_FILE, contents.node_ids.astype(np.int64, copy=False))
        if contents.labels is not None:
            _save(tmp / LABELS_FILE, contents.labels.astype(np.int64, copy=False))
        if contents.edge_weight is not None:
            _save(tmp / EDGE_WEIGHT_FILE, contents.edge_weight.astype(np.float32, copy=False))
        if contents.edge_features is not None:
            _save(tmp / EDGE_FEATURES_FILE, contents.edge_features.astype(np.float32, copy=False))
        if contents.edge_type is not None:
            _save(tmp / EDGE_TYPE_FILE, contents.edge_type.astype(EDGE_TYPE_DTYPE, copy=False))
        if contents.type_node_ids is not None:
            _save(tmp / TYPE_NODE_IDS_FILE, contents.type_node_ids.astype(np.int64, copy=False))
        shape = (contents.num_nodes, contents.features.dim)
        if shape[0] * shape[1] == 0:  # numpy cannot memory-map an empty array
            _save(tmp / FEATURES_FILE, np.zeros(shape, dtype=contents.features.dtype))
        else:
            fm = np.lib.format.open_memmap(
                tmp / FEATURES_FILE, mode="w+", dtype=contents.features.dtype, shape=shape
            )
            for start, rows in contents.feature_chunks(progress=progress):
                fm[start : start + rows.shape[0]] = rows
                h.feed(rows)
            fm.flush()
            del fm
        meta = GraphMeta(**contents.header(), version=h.hexdigest(), created_at=utc_now())
        write_meta(tmp, meta)
    log.info("wrote %s (%s) in %.1fs", out, meta.version, time.perf_counter() - t0)
    return meta
