"""Typed node sets: node types as contiguous storage-id ranges of one graph store.

A typed store is the homogeneous store with types laid over it (``docs/heterogeneous.md``):

- node type ``t`` owns storage ids ``[offset_t, offset_t + count_t)``; ``meta.json`` lists
  the types (:class:`NodeTypeInfo`: name, offset, count, feature width) in id order. RCMK
  reordering runs within each type's range (:func:`~.build.build_csc`'s ``node_groups``),
  so ranges survive it;
- a node's position within its type is ``0..count_t-1`` (PyG's and DGL's per-type
  indices); the store-wide external ID is ``offset_t + position`` — the numbering of PyG's
  ``HeteroData.to_homogeneous()`` and DGL's ``dgl.to_homogeneous`` — so every untyped
  API (``to_storage``, full evaluation) sees the graph as its homogeneous form. A typed
  request names a node by its ID within its type: its position, or, when the store has
  ``type_node_ids`` (each type's own ID space: account numbers, device hashes; distinct
  within a type, repeats across types allowed), that ID;
- one feature table ``[N, F]``: type ``t``'s rows use their first ``feature_dim_t``
  columns, the rest are zero (a type narrower than the widest pays the padding);
- every edge carries a relation ``"src__name__dst"`` (PyG's ``to_hetero`` naming) in the
  ``edge_type`` column; its endpoints lie in the named types' ranges;
- nodes added by live updates (stores whose types have their own IDs) are appended after
  every type: each batch adds a run of store-wide IDs ``N, N+1, …`` (storage ids equal to
  them) to one type's :attr:`NodeTypeInfo.added`, so no earlier node's ID moves. A type's
  positions go on past its base range: position ``count + j`` is its ``j``-th added node.

A store without ``node_types`` is the one-type case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_serializer

if TYPE_CHECKING:
    from hopserve.worker.graph.store import GraphStore

__all__ = [
    "NodeTypeInfo",
    "check_node_types",
    "check_type_node_ids",
    "check_typed_relations",
    "from_hetero",
    "relation_triple",
    "type_of",
    "typed_store",
]

SEPARATOR = "__"


class NodeTypeInfo(BaseModel):
    """One node type of a typed store: storage ids ``[offset, offset + count)``, then the
    runs of nodes live updates added to it (:attr:`added`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(min_length=1)
    offset: int = Field(ge=0)
    count: int = Field(ge=0, description="nodes of the base range (the store as built)")
    feature_dim: int = Field(ge=0, description="columns of the feature table this type uses")
    added: tuple[tuple[int, int], ...] = Field(
        default=(),
        description="runs (first store-wide ID, count) of nodes added by updates, in the "
        "order added (format version 5); their storage ids equal their store-wide IDs",
    )

    @model_serializer(mode="wrap")
    def _without_empty_runs(self, handler: Any) -> dict[str, Any]:
        """A type without added nodes writes the meta (and content hash) it always did."""
        out = handler(self)
        if not self.added:
            out.pop("added", None)
        return out

    @property
    def total(self) -> int:
        """Nodes of the type: the base range and every added run."""
        return self.count + sum(c for _, c in self.added)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """``(first id, count)`` of the base range, then of each added run."""
        return ((self.offset, self.count), *self.added)

    def ids(self) -> np.ndarray:
        """int64: every id of the type, the base range first, then the runs in order."""
        parts = [np.arange(s, s + c, dtype=np.int64) for s, c in self.ranges]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def entries(self, values: Any) -> np.ndarray:
        """The type's entries of a per-node array ``values`` ``[N, ...]``, in slot order:
        the base range (a view), then each added run."""
        if not self.added:
            return values[self.offset : self.offset + self.count]
        return np.asarray(values)[self.ids()]

    def added_ids(self, j: np.ndarray) -> np.ndarray:
        """int64: the id (store-wide = storage) of the type's ``j``-th added nodes
        (``0 <= j < total - count``)."""
        j = np.asarray(j, dtype=np.int64)
        starts = np.array([s for s, _ in self.added], dtype=np.int64)
        ends = np.cumsum([c for _, c in self.added], dtype=np.int64)  # j's past each run
        run = np.searchsorted(ends, j, side="right")
        before = np.concatenate([[0], ends])[run]
        return starts[run] + (j - before)

    def with_added(self, first: int, count: int) -> NodeTypeInfo:
        """This type with nodes ``first .. first + count - 1`` appended (a run right after
        the last one is merged into it)."""
        runs = list(self.added)
        if runs and runs[-1][0] + runs[-1][1] == first:
            runs[-1] = (runs[-1][0], runs[-1][1] + count)
        else:
            runs.append((int(first), int(count)))
        return self.model_copy(update={"added": tuple(runs)})


def check_node_types(
    types: Sequence[NodeTypeInfo], num_nodes: int, feature_dim: int
) -> list[NodeTypeInfo]:
    """Types in id order covering ``0..num_nodes-1`` without gaps, distinct names without
    ``__``, widths within the feature table's.

    Raises:
        ValueError: naming the type and what is wrong.
    """
    types = list(types)
    if not types:
        raise ValueError("node_types must list at least one type")
    at, seen = 0, set()
    for t in types:
        if SEPARATOR in t.name or t.name in seen:
            why = f"contains {SEPARATOR!r}" if SEPARATOR in t.name else "is repeated"
            raise ValueError(f"node type name {t.name!r} {why}")
        seen.add(t.name)
        if t.offset != at:
            raise ValueError(f"node type {t.name!r} starts at {t.offset}, expected {at}")
        if t.feature_dim > feature_dim:
            raise ValueError(
                f"node type {t.name!r} has {t.feature_dim} features, the table {feature_dim}"
            )
        at += t.count
    runs = sorted((s, c, t.name) for t in types for s, c in t.added)
    for first, count, name in runs:  # the added runs tile the ids after the base ranges
        if first != at or count < 1:
            raise ValueError(
                f"node type {name!r}: added run ({first}, {count}) should start at {at} "
                "and hold at least one node"
            )
        at += count
    if at != num_nodes:
        raise ValueError(f"node types cover {at} nodes, the graph has {num_nodes}")
    return types


def type_bounds(types: Sequence[NodeTypeInfo]) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, kinds)``: the first id of every non-empty range (base ranges and added
    runs), ascending, and the index of the type that owns it."""
    pairs = sorted((s, k) for k, t in enumerate(types) for s, c in t.ranges if c) or [(0, 0)]
    return (
        np.array([s for s, _ in pairs], dtype=np.int64),
        np.array([k for _, k in pairs], dtype=np.int64),
    )


def type_of(types: Sequence[NodeTypeInfo], ids: Any) -> np.ndarray:
    """int64: the type index of each store-wide (or storage: the ranges are the same)
    id ``0 <= id < N``."""
    starts, kinds = type_bounds(types)
    return kinds[np.maximum(np.searchsorted(starts, np.asarray(ids), side="right") - 1, 0)]


def check_type_node_ids(ids: Any, types: Sequence[NodeTypeInfo]) -> np.ndarray:
    """int64 ``[N]``: each node's ID within its type, distinct within every type.

    Raises:
        ValueError: not ``[N]`` integers, or an ID repeated within a type (naming the type,
            the ID and its two positions in the type).
    """
    from hopserve.worker.graph.ids import first_duplicate

    arr = np.asarray(ids)
    n = sum(int(t.total) for t in types)
    if arr.shape != (n,) or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(
            f"type_node_ids must be {n} integer IDs (one per node), got shape "
            f"{list(arr.shape)} of {arr.dtype}"
        )
    arr = arr.astype(np.int64, copy=False)
    for t in types:
        own = t.entries(arr)
        hit = first_duplicate(own)
        if hit is not None:
            row, first = hit
            raise ValueError(
                f"node type {t.name!r}: ID {int(own[row])} is repeated (its nodes {first} "
                f"and {row}); IDs must be distinct within a type"
            )
    return arr


def relation_triple(name: str) -> tuple[str, str, str]:
    """``"user__clicks__item"`` -> ``("user", "clicks", "item")``.

    Raises:
        ValueError: not three non-empty parts.
    """
    parts = name.split(SEPARATOR)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"relation {name!r} is not 'src{SEPARATOR}name{SEPARATOR}dst'")
    return parts[0], parts[1], parts[2]


def check_typed_relations(relations: Sequence[str], type_names: Sequence[str]) -> None:
    """Every relation is ``src__name__dst`` over known node types.

    Raises:
        ValueError: naming the relation.
    """
    known = set(type_names)
    for rel in relations:
        src, _, dst = relation_triple(rel)
        for end in (src, dst):
            if end not in known:
                raise ValueError(
                    f"relation {rel!r} names node type {end!r}, not one of {sorted(known)}"
                )


def _check_edge_ends(types: list[NodeTypeInfo], relations: list[str], src, dst, edge_type) -> None:  # noqa: ANN001 - int arrays
    """Each edge's endpoints lie in its relation's node types (naming the first that does
    not)."""
    index = {t.name: k for k, t in enumerate(types)}
    bounds = np.array([t.offset for t in types] + [types[-1].offset + types[-1].count])
    src_of = np.array([index[relation_triple(r)[0]] for r in relations], dtype=np.int64)
    dst_of = np.array([index[relation_triple(r)[2]] for r in relations], dtype=np.int64)
    et = np.asarray(edge_type, dtype=np.int64)
    for what, ends, want in (("source", src, src_of[et]), ("destination", dst, dst_of[et])):
        ends = np.asarray(ends, dtype=np.int64)
        bad = (ends < bounds[want]) | (ends >= bounds[want + 1])
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"edge {e} of relation {relations[et[e]]!r}: its {what} {int(ends[e])} is not "
                f"a {types[want[e]].name!r} node (ids {bounds[want[e]]}..{bounds[want[e] + 1] - 1})"
            )


def _edge_column(
    key: str,
    values: Mapping[tuple[str, str, str], Any],
    edge_index_dict: Mapping[tuple[str, str, str], Any],
    numpy: Any,
) -> np.ndarray:
    """One edge column ``[E]`` / ``[E, d_e]`` from per-relation rows, in the relations'
    order (the order :func:`from_hetero` concatenates their edges in)."""
    rows, width = [], None
    for rel, ei in edge_index_dict.items():
        if rel not in values:
            raise ValueError(
                f"{key}_dict has no rows for relation {rel}; give every relation its "
                f"{key} (a store has one edge column), or none"
            )
        v = numpy(values[rel]).astype(np.float32)
        if key == "edge_attr" and v.ndim == 1:
            v = v.reshape(-1, 1)
        e = int(numpy(ei).shape[1])
        want = (e,) if key == "edge_weight" else (e, width if width is not None else v.shape[-1])
        if v.shape != want:
            raise ValueError(
                f"{key}_dict[{rel}] has shape {list(v.shape)}, expected {list(want)} "
                f"({e} edges{'' if key == 'edge_weight' else ', every relation one width'})"
            )
        width = v.shape[-1] if v.ndim == 2 else None
        rows.append(v)
    extra = [rel for rel in values if rel not in edge_index_dict]
    if extra:
        raise ValueError(f"{key}_dict names relations without edges: {extra}")
    if rows:
        return np.concatenate(rows)
    return np.zeros((0, 1) if key == "edge_attr" else (0,), np.float32)


def typed_store(
    types: Sequence[tuple[str, int]],
    src: np.ndarray,
    dst: np.ndarray,
    edge_type: np.ndarray,
    relations: Sequence[str],
    features: np.ndarray,
    *,
    feature_dims: Sequence[int] | None = None,
    labels: np.ndarray | None = None,
    edge_weight: np.ndarray | None = None,
    edge_attr: np.ndarray | None = None,
    type_node_ids: np.ndarray | None = None,
    reorder: str | None = "rcmk",
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> GraphStore:
    """A typed store from edges in global input ids (types concatenated in ``types`` order).

    Args:
        types: ``(name, count)`` per node type, in id order.
        src, dst: ``[E]`` global input ids (type ``t``'s nodes are ``offset_t + i``).
        edge_type: ``[E]`` relation id per edge (index into ``relations``).
        relations: ``"src__name__dst"`` per relation id.
        features: ``[N, F]`` in input order (narrower types zero-padded).
        feature_dims: columns each type uses (default: all ``F``).
        labels: ``[N]`` integer labels (``-1`` none).
        edge_weight, edge_attr: optional edge columns ``[E]`` / ``[E, d_e]``.
        type_node_ids: ``[N]`` each node's ID within its type (the types' own ID spaces),
            in input order; default: its position in the type.
        reorder: ``"rcmk"`` (within each type) or ``None``.
        out: write the store there (atomically) instead of keeping it in memory.

    Raises:
        ValueError: bad types, relations, or an edge whose ends are not of its relation's
            types (naming the edge).
    """
    from hopserve.worker.graph.build import build_csc
    from hopserve.worker.graph.contents import contents_from_csc, materialize, write_contents
    from hopserve.worker.graph.relations import check_relation_names, validate_edge_type
    from hopserve.worker.graph.store import GraphStore

    counts = [int(c) for _, c in types]
    n = sum(counts)
    dims = list(feature_dims) if feature_dims is not None else [int(features.shape[1])] * len(types)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    infos = check_node_types(
        [
            NodeTypeInfo(name=name, offset=int(off), count=c, feature_dim=w)
            for (name, _), off, c, w in zip(types, offsets, counts, dims, strict=True)
        ],
        n,
        int(features.shape[1]),
    )
    relations = check_relation_names(relations)
    check_typed_relations(relations, [t.name for t in infos])
    edge_type = validate_edge_type(edge_type, np.asarray(src).size, len(relations))
    _check_edge_ends(infos, relations, src, dst, edge_type)
    groups = np.repeat(np.arange(len(infos), dtype=np.int64), counts)
    csc = build_csc(
        src, dst, n, reorder=reorder, progress=progress, track_edges=True, node_groups=groups
    )
    contents = contents_from_csc(
        csc,
        features,
        labels=labels,
        edge_weight=edge_weight,
        edge_features=edge_attr,
        edge_type=edge_type,
        relations=relations,
        node_types=infos,
        type_node_ids=type_node_ids,
    )
    if out is None:
        return GraphStore._from_arrays(materialize(contents, progress=progress))
    write_contents(out, contents, overwrite=overwrite, progress=progress)
    return GraphStore.open(out)


def from_hetero(
    x_dict: Mapping[str, Any],
    edge_index_dict: Mapping[tuple[str, str, str], Any],
    *,
    labels_dict: Mapping[str, Any] | None = None,
    num_nodes_dict: Mapping[str, int] | None = None,
    node_types: Sequence[str] | None = None,
    edge_attr_dict: Mapping[tuple[str, str, str], Any] | None = None,
    edge_weight_dict: Mapping[tuple[str, str, str], Any] | None = None,
    node_ids_dict: Mapping[str, Any] | None = None,
    **kw: Any,
) -> GraphStore:
    """A typed store from per-type features and per-relation edge indices (PyG
    ``HeteroData``'s ``x_dict`` / ``edge_index_dict``, DGL heterograph tensors).

    ``edge_index_dict[(src, name, dst)]`` is ``[2, E_r]`` in per-type indices. Features of
    different widths are zero-padded to the widest (``feature_dim`` per type kept in the
    meta); a type without features gets none (width 0, ``num_nodes_dict`` gives its count).
    ``edge_attr_dict[rel]`` ``[E_r, d_e]`` and ``edge_weight_dict[rel]`` ``[E_r]`` become the
    store's edge columns (every relation needs its rows, the features one width: the
    homogeneous form's edge columns, what a model's ``edge_attr`` / ``edge_weight`` is
    served with). ``node_ids_dict[t]`` ``[N_t]`` gives type ``t``'s nodes their own IDs
    (distinct within the type; a type left out keeps ``0..N_t-1``), which typed requests
    name them by; edge indices stay positional. Other keywords go to :func:`typed_store`.

    Raises:
        ValueError: an edge index naming an unknown type, ends out of range, or edge data
            missing for a relation, of another length or width (naming the relation).
    """
    import torch

    def numpy(v: Any) -> np.ndarray:
        return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)

    names = list(node_types) if node_types is not None else list(x_dict)
    for rel in edge_index_dict:
        for end in (rel[0], rel[2]):
            if end not in names:
                names.append(end)
    counts = []
    for t in names:
        if t in x_dict:
            counts.append(int(numpy(x_dict[t]).shape[0]))
        elif num_nodes_dict and t in num_nodes_dict:
            counts.append(int(num_nodes_dict[t]))
        else:
            raise ValueError(f"node type {t!r} has no features and no count (num_nodes_dict)")
    offsets = dict(zip(names, np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist(), strict=True))
    dims = [int(numpy(x_dict[t]).shape[1]) if t in x_dict else 0 for t in names]
    width = max(dims) if dims else 0
    features = np.zeros((sum(counts), width), dtype=np.float32)
    for t, w in zip(names, dims, strict=True):
        if t in x_dict:
            features[offsets[t] : offsets[t] + numpy(x_dict[t]).shape[0], :w] = numpy(x_dict[t])
    relations, srcs, dsts, ids = [], [], [], []
    for r, ((s_type, rel, d_type), ei) in enumerate(edge_index_dict.items()):
        ei = numpy(ei).astype(np.int64)
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise ValueError(
                f"edge index of {(s_type, rel, d_type)} has shape {list(ei.shape)}, expected [2, E]"
            )
        for end, row, t in (("source", 0, s_type), ("destination", 1, d_type)):
            count = counts[names.index(t)]
            bad = (ei[row] < 0) | (ei[row] >= count)
            if bad.any():
                e = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"edge {e} of {(s_type, rel, d_type)}: {end} {int(ei[row, e])} is not a "
                    f"{t!r} node (0..{count - 1})"
                )
        relations.append(f"{s_type}{SEPARATOR}{rel}{SEPARATOR}{d_type}")
        srcs.append(ei[0] + offsets[s_type])
        dsts.append(ei[1] + offsets[d_type])
        ids.append(np.full(ei.shape[1], r, dtype=np.int16))
    for key, values in (("edge_attr", edge_attr_dict), ("edge_weight", edge_weight_dict)):
        if values is not None:
            kw[key] = _edge_column(key, values, edge_index_dict, numpy)
    labels = None
    if labels_dict:
        labels = np.full(sum(counts), -1, dtype=np.int64)
        for t, y in labels_dict.items():
            y = numpy(y).reshape(-1)
            labels[offsets[t] : offsets[t] + y.size] = y
    if node_ids_dict:
        from hopserve.worker.graph.build import as_int64  # (build imports this module)

        unknown = [t for t in node_ids_dict if t not in names]
        if unknown:
            raise ValueError(f"node_ids_dict names node types the graph lacks: {unknown}")
        own = np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
        for t, given in node_ids_dict.items():
            given = as_int64(numpy(given).reshape(-1), f"node_ids_dict[{t!r}]")
            count = counts[names.index(t)]
            if given.size != count:
                raise ValueError(
                    f"node_ids_dict[{t!r}] has {given.size} IDs, the type {count} nodes"
                )
            own[offsets[t] : offsets[t] + count] = given
        kw["type_node_ids"] = own
    empty = np.zeros(0, np.int64)
    return typed_store(
        list(zip(names, counts, strict=True)),
        np.concatenate(srcs) if srcs else empty,
        np.concatenate(dsts) if dsts else empty,
        np.concatenate(ids) if ids else np.zeros(0, np.int16),
        relations,
        features,
        feature_dims=dims,
        labels=labels,
        **kw,
    )
