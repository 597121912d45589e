"""Typed edges: the relation id of every edge, and the relation names of a store.

A store with typed edges holds ``edge_type`` int16 ``[E]`` in CSC order (like the other
edge columns) and ``relations`` in its meta: relation ``r`` is named ``relations[r]``.
Models that take per-edge relation ids (PyG ``RGCNConv(x, edge_index, edge_type)``, DGL
``RelGraphConv(g, x, etypes)``) are served from that column.

Relations arrive as integer ids (``data.edge_type``, a DGL ``edata`` tensor, an integer
column) or as names (a Parquet string column); :func:`relation_ids` turns either into ids
plus names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "EDGE_TYPE_DTYPE",
    "MAX_RELATIONS",
    "check_relation_names",
    "default_relation_names",
    "relation_ids",
    "validate_edge_type",
]

EDGE_TYPE_DTYPE = np.dtype(np.int16)
MAX_RELATIONS = int(np.iinfo(EDGE_TYPE_DTYPE).max) + 1
"""Relation ids are ``0..MAX_RELATIONS-1`` (int16 on disk)."""


def default_relation_names(num_relations: int) -> list[str]:
    """``["0", "1", ...]``: names for relations given as ids only."""
    return [str(r) for r in range(num_relations)]


def check_relation_names(names: Sequence[str]) -> list[str]:
    """Relation names: 1 to :data:`MAX_RELATIONS` distinct non-empty strings.

    Raises:
        ValueError: empty, too many, an empty name or a repeated one (naming it).
    """
    names = list(names)
    if not names:
        raise ValueError("relations must name at least one relation")
    if len(names) > MAX_RELATIONS:
        raise ValueError(f"{len(names)} relations; at most {MAX_RELATIONS} are supported")
    seen: set[str] = set()
    for r, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ValueError(f"relation {r} has no name ({name!r})")
        if name in seen:
            raise ValueError(f"relation name {name!r} is repeated (relation {r})")
        seen.add(name)
    return names


def validate_edge_type(
    edge_type: Any, num_edges: int, num_relations: int | None = None
) -> np.ndarray:
    """Relation ids, one per edge: integers in ``0..num_relations-1``. Returns int16 ``[E]``.

    ``num_relations`` ``None``: any id below :data:`MAX_RELATIONS`.

    Raises:
        ValueError: wrong shape, non-integer dtype, or an id out of range (naming the edge).
    """
    arr = np.asarray(edge_type)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr.reshape(-1)
    if arr.ndim != 1 or arr.shape[0] != num_edges:
        raise ValueError(
            f"edge_type must have shape [{num_edges}] (one relation id per edge), "
            f"got {[*arr.shape]}"
        )
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "b" and arr.size == 0):
        raise ValueError(f"edge_type must hold integer relation ids, got dtype {arr.dtype}")
    limit = MAX_RELATIONS if num_relations is None else num_relations
    if arr.size:
        bad = np.flatnonzero((arr < 0) | (arr >= limit))
        if bad.size:
            e = int(bad[0])
            raise ValueError(
                f"edge_type of edge {e} is {int(arr[e])}, outside the relation ids 0..{limit - 1}"
            )
    return np.ascontiguousarray(arr, dtype=EDGE_TYPE_DTYPE)


def relation_ids(values: Any, names: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Per-edge relations (integer ids or names) -> (int16 ids ``[E]``, relation names).

    Names are mapped to ids in the order ``names`` gives, or sorted when ``names`` is
    ``None``. Integer ids keep their value; their names are ``names`` or ``"0".."R-1"`` for
    ``R = max id + 1``.

    Raises:
        ValueError: an unknown name, an id out of range, or a dtype that is neither.
    """
    arr = np.asarray(values)
    if arr.dtype.kind in "US" or arr.dtype == object:
        text = arr.astype(str)
        if names is None:
            names = sorted(set(text.tolist()))
        names = check_relation_names(names)
        index = {name: r for r, name in enumerate(names)}
        unique, inverse = np.unique(text, return_inverse=True)
        missing = [u for u in unique.tolist() if u not in index]
        if missing:
            raise ValueError(f"unknown relation {missing[0]!r}; the relations are {names}")
        lut = np.array([index[u] for u in unique.tolist()], dtype=EDGE_TYPE_DTYPE)
        ids = lut[inverse.reshape(-1)] if unique.size else np.zeros(0, EDGE_TYPE_DTYPE)
        return validate_edge_type(ids, ids.size, len(names)), names
    ids = validate_edge_type(arr, arr.reshape(-1).size if arr.ndim <= 1 else arr.shape[0])
    if names is None:
        names = default_relation_names(int(ids.max()) + 1 if ids.size else 1)
    names = check_relation_names(names)
    return validate_edge_type(ids, ids.size, len(names)), names
