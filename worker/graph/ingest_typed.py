"""``ingest_typed``: a typed graph store from per-type node files and per-relation edge files.

Each node type has a features ``.npy`` ``[N_t, F_t]`` (widths may differ: narrower types
are zero-padded, :mod:`~.node_types`), optionally labels ``.npy`` ``[N_t]`` and optionally
its own node IDs ``.npy`` ``[N_t]`` (distinct within the type: account numbers, device
hashes; the store keeps them and typed requests name nodes by them). Each relation
``(src_type, name, dst_type)`` has an edge file in any format :func:`~.readers.read_edges`
reads (text, ``.npy``, ``.npz``, ``.parquet``) whose endpoints are the types' IDs (their
own, or the row indices ``0..N_t-1`` of a type without an ID file); its edge data columns (a weight, edge
features) follow the same convention as ``ingest``'s, and every relation file must carry
the same columns (the store holds one weight column and one edge feature table). Errors
name the file, the row and the type; nothing is left on disk when ingest fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hopserve.worker.graph.atomic import check_target
from hopserve.worker.graph.build import normalize_reorder
from hopserve.worker.graph.errors import IngestError
from hopserve.worker.graph.ids import IdIndex
from hopserve.worker.graph.readers import (
    check_features_finite,
    load_features,
    load_labels,
    load_node_ids,
    read_edges,
)

if TYPE_CHECKING:
    from hopserve.worker.graph.store import GraphStore

__all__ = ["ingest_typed"]

log = logging.getLogger(__name__)

Relation = tuple[str, str, str]


def ingest_typed(
    nodes: Mapping[str, str | Path],
    edges: Mapping[Relation, str | Path],
    *,
    out: str | Path,
    labels: Mapping[str, str | Path] | None = None,
    node_ids: Mapping[str, str | Path] | None = None,
    reorder: str | None = "rcmk",
    delimiter: str | None = None,
    skip_header: bool = False,
    edge_data: str = "weight",
    overwrite: bool = False,
    progress: bool = True,
) -> GraphStore:
    """Validate the files, build the typed store and write it to ``out`` atomically.

    Args:
        nodes: node type -> features ``.npy`` (types are stored in this order).
        edges: ``(src_type, name, dst_type)`` -> edge file.
        labels: node type -> labels ``.npy`` (others unlabeled, ``-1``).
        node_ids: node type -> its own node IDs ``.npy`` ``[N_t]`` (others: row indices).
        edge_data: what edge files' columns after ``src, dst`` hold (``"weight"`` or
            ``"features"``, as for ``ingest``).

    Raises:
        IngestError: bad input (names file, row and type); nothing is written.
        FileExistsError: ``out`` is not empty and ``overwrite`` is false.
    """
    from hopserve.worker.graph.node_types import SEPARATOR, typed_store

    t0 = time.perf_counter()
    normalize_reorder(reorder)
    check_target(out, overwrite=overwrite)
    if not nodes or not edges:
        raise IngestError(Path(out), None, "give at least one node file and one relation file")
    feats: dict[str, np.ndarray] = {}
    for name, path in nodes.items():
        if not name or SEPARATOR in name:
            raise IngestError(
                Path(path), None, f"node type name {name!r} is empty or has {SEPARATOR!r}"
            )
        feats[name] = load_features(path)
        check_features_finite(path, feats[name], progress=progress)
    counts = {t: int(f.shape[0]) for t, f in feats.items()}
    offsets = dict(
        zip(
            counts,
            np.concatenate([[0], np.cumsum(list(counts.values()))[:-1]]).tolist(),
            strict=True,
        )
    )
    own_ids = _type_ids(node_ids or {}, counts)
    lookup = {t: IdIndex(a, a.size) for t, a in own_ids.items()}
    srcs, dsts, ids, weights, features = [], [], [], [], []
    shape = None  # (has weight, feature width) of the first relation file
    relations = []
    for r, ((s_type, rel, d_type), path) in enumerate(edges.items()):
        for end in (s_type, d_type):
            if end not in counts:
                raise IngestError(
                    Path(path), None, f"relation {(s_type, rel, d_type)} names node type {end!r}, "
                    f"which has no node file (types: {', '.join(counts)})"
                )  # fmt: skip
        edge_list = read_edges(
            path,
            delimiter=delimiter,
            skip_header=skip_header,
            progress=progress,
            edge_data=edge_data,
        )
        ends = {}
        for column, values, t in (("src", edge_list.src, s_type), ("dst", edge_list.dst, d_type)):
            if t in lookup:
                ends[column], found = lookup[t].find(values)
                bad = ~found
            else:
                ends[column], bad = values, (values < 0) | (values >= counts[t])
            if bad.any():
                e = int(np.argmax(bad))
                known = (
                    f"not in {node_ids[t]}" if t in own_ids else f"its IDs are 0..{counts[t] - 1}"
                )
                raise IngestError(
                    edge_list.file, edge_list.row_of(e),
                    f"{column} {int(values[e])} is not a {t!r} node ({known})",
                )  # fmt: skip
        width = None if edge_list.features is None else int(edge_list.features.shape[1])
        row_shape = (edge_list.weight is not None, width)
        if shape is None:
            shape = row_shape
        elif row_shape != shape:
            raise IngestError(
                edge_list.file, None, f"edge data {row_shape} (weight, feature width) differs from "
                f"the first relation file's {shape}: every relation needs the same columns"
            )  # fmt: skip
        relations.append(f"{s_type}{SEPARATOR}{rel}{SEPARATOR}{d_type}")
        srcs.append(ends["src"] + offsets[s_type])
        dsts.append(ends["dst"] + offsets[d_type])
        ids.append(np.full(len(edge_list), r, dtype=np.int16))
        weights.append(edge_list.weight)
        features.append(edge_list.features)
    width = max(f.shape[1] for f in feats.values())
    table = np.zeros((sum(counts.values()), width), dtype=np.float32)
    for t, f in feats.items():
        table[offsets[t] : offsets[t] + counts[t], : f.shape[1]] = f
    label_rows = None
    if labels:
        label_rows = np.full(table.shape[0], -1, dtype=np.int64)
        for t, path in labels.items():
            if t not in counts:
                raise IngestError(
                    Path(path), None, f"labels for node type {t!r}, which has no node file"
                )
            label_rows[offsets[t] : offsets[t] + counts[t]] = load_labels(path, counts[t])
    has_weight, has_features = bool(shape and shape[0]), bool(shape and shape[1])
    type_node_ids = None
    if own_ids:
        type_node_ids = np.concatenate(
            [own_ids[t] if t in own_ids else np.arange(counts[t]) for t in counts]
        )
    store = typed_store(
        [(t, counts[t]) for t in counts],
        np.concatenate(srcs) if srcs else np.zeros(0, np.int64),
        np.concatenate(dsts) if dsts else np.zeros(0, np.int64),
        np.concatenate(ids) if ids else np.zeros(0, np.int16),
        relations,
        table,
        feature_dims=[int(f.shape[1]) for f in feats.values()],
        labels=label_rows,
        edge_weight=np.concatenate(weights) if has_weight else None,
        edge_attr=np.concatenate(features) if has_features else None,
        type_node_ids=type_node_ids,
        reorder=reorder,
        out=out,
        overwrite=overwrite,
        progress=progress,
    )
    log.info("ingest_typed done in %.1fs", time.perf_counter() - t0)
    return store


def _type_ids(files: Mapping[str, str | Path], counts: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Each type's own ID file, loaded (distinct IDs, one per feature row)."""
    out = {}
    for t, path in files.items():
        if t not in counts:
            raise IngestError(
                Path(path), None, f"node IDs for node type {t!r}, which has no node file"
            )
        ids = load_node_ids(path)
        if ids.size != counts[t]:
            raise IngestError(
                Path(path), None,
                f"has {ids.size} node IDs but node type {t!r} has {counts[t]} feature rows",
            )  # fmt: skip
        out[t] = ids
    return out
