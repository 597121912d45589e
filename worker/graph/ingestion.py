"""``ingest``: validate user files and build a graph-store directory from them.

Inputs are read by :mod:`~.readers` (edge list as text/.npy/.npz, features/.npy, optional
external node IDs and labels). With node IDs, row ``i`` of that file is the external ID of
feature row ``i`` and edge endpoints are external IDs; without, endpoints are feature row
indices ``0..N-1``. Edge data columns (an edge weight, edge features) follow their edges
into the store's CSC order (see :mod:`~.readers` for the column convention). Every problem
raises :class:`~.errors.IngestError` naming the file and,
where it applies, the 1-based row; nothing is left on disk when ingest fails (the write
is atomic, and a non-empty target is refused before any work unless ``overwrite``).
:func:`ingest_with_stats` also returns what the edge transforms did (e.g. how many reverse
edges ``symmetrize`` added), for the CLI summary.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hopserve.worker.graph.atomic import check_target
from hopserve.worker.graph.build import BuildStats, build_csc, normalize_reorder
from hopserve.worker.graph.contents import ArrayFeatures, contents_from_csc, write_contents
from hopserve.worker.graph.errors import IngestError
from hopserve.worker.graph.ids import IdIndex
from hopserve.worker.graph.readers import (
    EdgeList,
    check_features_finite,
    load_features,
    load_labels,
    load_node_ids,
    read_edges,
)

if TYPE_CHECKING:
    from hopserve.worker.graph.store import GraphStore

__all__ = ["IngestResult", "ingest", "ingest_with_stats"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- endpoints
def _first_bad_edge(
    edges: EdgeList, bad_src: np.ndarray, bad_dst: np.ndarray
) -> tuple[int, str, int]:
    """``(edge number, column, value)`` of the earliest flagged endpoint."""
    e_src = int(np.argmax(bad_src)) if bad_src.any() else edges.src.size
    e_dst = int(np.argmax(bad_dst)) if bad_dst.any() else edges.dst.size
    if e_src <= e_dst:
        return e_src, "src", int(edges.src[e_src])
    return e_dst, "dst", int(edges.dst[e_dst])


def _resolve_endpoints(
    edges: EdgeList,
    num_nodes: int,
    node_ids: np.ndarray | None,
    ids_file: Path | None,
    feats_file: Path,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw endpoint values -> node indices (row numbers of the features file)."""
    if node_ids is not None:
        index = IdIndex(node_ids, num_nodes)
        src, ok_src = index.find(edges.src)
        dst, ok_dst = index.find(edges.dst)
        if not (ok_src.all() and ok_dst.all()):
            e, col, value = _first_bad_edge(edges, ~ok_src, ~ok_dst)
            raise IngestError(
                edges.file, edges.row_of(e), f"unknown node ID {value} ({col}; not in {ids_file})"
            )
        return src, dst
    bad_src = (edges.src < 0) | (edges.src >= num_nodes)
    bad_dst = (edges.dst < 0) | (edges.dst >= num_nodes)
    if bad_src.any() or bad_dst.any():
        e, col, value = _first_bad_edge(edges, bad_src, bad_dst)
        if value < 0:
            raise IngestError(edges.file, edges.row_of(e), f"negative node ID {value} ({col})")
        raise IngestError(
            edges.file,
            edges.row_of(e),
            f"node ID {value} ({col}) out of range: {feats_file} has {num_nodes} rows "
            f"(valid IDs 0..{num_nodes - 1}; pass --node-ids for external IDs)",
        )
    return edges.src, edges.dst


@dataclass(frozen=True)
class IngestResult:
    """What :func:`ingest_with_stats` wrote: the opened store and the edge counts."""

    store: GraphStore
    stats: BuildStats


def ingest(edges: str | Path, features: str | Path, **options: Any) -> GraphStore:
    """Validate input files, build the CSC store and write it to ``out`` atomically.

    Takes the arguments of :func:`ingest_with_stats` (``out`` is required) and returns
    only the written store, opened memory-mapped.
    """
    return ingest_with_stats(edges, features, **options).store


def ingest_with_stats(
    edges: str | Path,
    features: str | Path,
    *,
    out: str | Path,
    node_ids: str | Path | None = None,
    labels: str | Path | None = None,
    symmetrize: bool = False,
    add_self_loops: bool = False,
    dedup: bool = False,
    reorder: str | None = "rcmk",
    delimiter: str | None = None,
    skip_header: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    edge_data: str = "weight",
    relation_column: bool = False,
) -> IngestResult:
    """Validate input files, build the CSC store and write it to ``out`` atomically.

    ``symmetrize`` adds only the missing reverse edges (see :func:`~.build.build_csc`).
    ``edge_data`` says what the edge file's columns after ``src, dst`` hold: ``"weight"``
    (the third is the weight, further ones edge features) or ``"features"``;
    ``relation_column``: the third column of a text or ``.npy`` edge file is the edge's
    relation id (see :mod:`~.readers`). An edge file with edge data or relations cannot be combined with ``add_self_loops`` or ``dedup`` (``symmetrize``
    gives each added reverse edge the data of the edge it mirrors).

    Returns:
        The written store (opened memory-mapped) and :class:`~.build.BuildStats`
        (input edges, reverse edges added by ``symmetrize``, self-loops added, duplicates
        removed).

    Raises:
        IngestError: bad input (names file and row); nothing is written.
        FileExistsError: ``out`` is not empty and ``overwrite`` is false.
    """
    from hopserve.worker.graph.store import GraphStore

    t0 = time.perf_counter()
    normalize_reorder(reorder)  # fail fast on a typo
    check_target(out, overwrite=overwrite)
    feats_path = Path(features)
    feats = load_features(feats_path)
    ids_path = None if node_ids is None else Path(node_ids)
    ids = None if ids_path is None else load_node_ids(ids_path)
    n = feats.shape[0]
    if ids is not None and ids.size != n:
        raise IngestError(
            feats_path, None, f"has {n} feature rows but {ids_path} has {ids.size} node IDs"
        )
    lab = None if labels is None else load_labels(labels, n)
    check_features_finite(feats_path, feats, progress=progress)
    edge_list = read_edges(
        edges,
        delimiter=delimiter,
        skip_header=skip_header,
        progress=progress,
        edge_data=edge_data,
        relation_column=relation_column,
    )
    weight, edge_feats = edge_list.weight, edge_list.features
    edge_type, relations = edge_list.edge_type, edge_list.relations
    has_edge_data = weight is not None or edge_feats is not None or edge_type is not None
    if has_edge_data and (add_self_loops or dedup):
        flags = [flag for flag, on in (("--self-loops", add_self_loops), ("--dedup", dedup)) if on]
        raise IngestError(
            edge_list.file,
            None,
            f"has edge data columns, which {', '.join(flags)} cannot keep (added self-loops "
            "would have no weight, features or relation, dedup would merge differing rows); add "
            "those edges with their data to the file instead",
        )
    src, dst = _resolve_endpoints(edge_list, n, ids, ids_path, feats_path)
    log.info("read %d edges over %d nodes from %s", src.size, n, edge_list.file)
    csc = build_csc(
        src,
        dst,
        n,
        symmetrize=symmetrize,
        add_self_loops=add_self_loops,
        dedup=dedup,
        reorder=reorder,
        progress=progress,
        track_edges=has_edge_data,
    )
    del src, dst, edge_list
    contents = contents_from_csc(
        csc,
        ArrayFeatures(feats),
        labels=lab,
        node_ids=ids,
        edge_weight=weight,
        edge_features=edge_feats,
        edge_type=edge_type,
        relations=relations,
    )
    write_contents(out, contents, overwrite=overwrite, progress=progress)
    log.info("ingest done in %.1fs", time.perf_counter() - t0)
    return IngestResult(GraphStore.open(out), csc.stats)
