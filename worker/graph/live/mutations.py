"""A batch of graph mutations: its typed form, its checks and its bytes in the update log.

A :class:`MutationBatch` names nodes by *external* ID (what clients send);
:func:`resolve` checks it whole against the graph as it is and returns a
:class:`ResolvedBatch` in storage ids, or raises :class:`InvalidUpdateError` naming the
first offending mutation (kind, index, value), so a bad batch is refused before any of it
is written or applied. Order inside a batch: add_nodes, remove_edges, add_edges,
set_features. New nodes get storage ids ``N, N+1, …`` in the order given.

Edge data: on a graph whose store holds an edge weight column (``edge_weight``) and/or
edge features (``edge_features``, width ``d_e``), every added edge carries its weight /
feature row (:attr:`MutationBatch.add_edge_weight`, :attr:`MutationBatch.add_edge_features`);
a missing one, a wrong width, NaN/Inf, or edge data for a column the graph lacks is
refused. On a graph with typed edges (``edge_type``, relation names in its meta) every
added edge names its relation (:attr:`MutationBatch.add_edge_type`: names or ids); an
unknown one is refused. Removed edges take their data with them and need none; removing
``src -> dst`` removes it under every relation.

Typed nodes: on a store whose node types have their own IDs, new nodes name their type
(:attr:`MutationBatch.add_node_type`) and are new IDs within it; they get the store-wide
IDs ``N, N+1, …`` (an added run of the type, :mod:`~hopserve.worker.graph.node_types`),
and edges of the same batch name them by their type and ID like every other node there.

Log bytes (:func:`encode` / :func:`decode`): no pickle, only a fixed header per array
(name, dtype code, length) and the raw little-endian values. A batch carrying edge data or
typed nodes appends a *trailer* (``b"HSED"``, a flags byte, then the arrays it flags); a
batch without any encodes exactly as before the trailer existed, and records written
before it decode unchanged (no trailer: no edge data, no typed nodes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hopserve.worker.graph.ids import IdIndex, first_duplicate

__all__ = [
    "InvalidUpdateError",
    "MutationBatch",
    "ResolvedBatch",
    "decode",
    "encode",
    "resolve",
]

MAX_KEY_CHARS = 128


class InvalidUpdateError(ValueError):
    """The batch cannot be applied (names the offending mutation); nothing was applied."""


_WHAT = {  # field -> the mutation's name in error messages
    "add_node_ids": "add_nodes",
    "remove_src": "remove_edges.src",
    "remove_dst": "remove_edges.dst",
    "add_src": "add_edges.src",
    "add_dst": "add_edges.dst",
    "set_node_ids": "set_features",
}
_INT64_MAX = np.iinfo(np.int64).max


def _ids(values: object, what: str) -> np.ndarray:
    """A 1-D int64 copy of node IDs; anything that is not integers in int64's range is
    refused (a cast would truncate ``7.9`` to node 7 or wrap a large uint64 to a negative
    ID, silently naming another node)."""
    if values is None:
        return np.empty(0, dtype=np.int64)
    try:
        arr = np.asarray(values)
    except ValueError as err:  # ragged nested lists
        raise InvalidUpdateError(f"{what}: not a list of node IDs ({err})") from None
    if arr.ndim > 1:
        raise InvalidUpdateError(f"{what}: node IDs must be 1-D, got shape {list(arr.shape)}")
    arr = arr.reshape(-1)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidUpdateError(f"{what}: node IDs must be integers, got {arr.dtype}")
    if arr.dtype.kind == "u" and arr.max() > _INT64_MAX:
        i = int(np.argmax(arr > _INT64_MAX))
        raise InvalidUpdateError(f"{what}[{i}]: node ID {int(arr[i])} does not fit in int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


@dataclass
class MutationBatch:
    """Mutations applied atomically, in the order of the fields."""

    add_node_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """External IDs of new nodes (int64 ``[k]``)."""
    add_node_features: np.ndarray | None = None
    """Their features, float32 ``[k, F]``."""
    remove_src: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Edges to remove (every copy of each ``src -> dst``), sources."""
    remove_dst: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """... and destinations."""
    add_src: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Edges to add, sources (external IDs)."""
    add_dst: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """... and destinations."""
    set_node_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Existing nodes whose features are replaced."""
    set_features: np.ndarray | None = None
    """Their new features, float32 ``[m, F]``."""
    idempotency_key: str = ""
    """Client key making a retry safe ("" = none)."""
    add_edge_weight: np.ndarray | None = None
    """Weight of each added edge, float ``[len(add_src)]``: required on a graph holding an
    edge weight column, refused on one without (``None`` = not given)."""
    add_edge_features: np.ndarray | None = None
    """Feature row of each added edge, float ``[len(add_src), d_e]``: required on a graph
    holding edge features (``d_e`` its width), refused on one without."""
    add_edge_type: np.ndarray | list | None = None
    """Relation of each added edge, ``[len(add_src)]`` names (strings) or ids: required on
    a graph with typed edges, refused on one without."""
    remove_edge_type: np.ndarray | list | None = None
    """Relation of each removed edge, ``[len(remove_src)]`` names or ids (graphs with node
    types): its ends are read as IDs within the relation's node types (required where the
    types have their own IDs). The pair still goes under every relation."""
    set_node_type: str = ""
    """The node type ``set_node_ids`` are IDs within (graphs with node types; required where
    the types have their own IDs); empty: store-wide IDs."""
    add_node_type: str = ""
    """The node type of ``add_node_ids``, each a new ID within it (required on a graph with
    node types, which takes new nodes where the types have their own IDs); their features
    are the graph's width or the type's (padded with zeros)."""

    def __post_init__(self) -> None:
        for name in (
            "add_node_ids",
            "remove_src",
            "remove_dst",
            "add_src",
            "add_dst",
            "set_node_ids",
        ):
            setattr(self, name, _ids(getattr(self, name), _WHAT[name]))

    @property
    def empty(self) -> bool:
        """Whether the batch mutates nothing."""
        return not (
            self.add_node_ids.size or self.remove_src.size or self.add_src.size
            or self.set_node_ids.size
        )  # fmt: skip

    @property
    def num_mutations(self) -> int:
        """Nodes added + edges removed/added + feature rows set."""
        return int(
            self.add_node_ids.size + self.remove_src.size + self.add_src.size
            + self.set_node_ids.size
        )  # fmt: skip


@dataclass
class ResolvedBatch:
    """A checked batch in storage ids of the graph it was resolved against."""

    seq: int
    """Graph sequence this batch creates."""
    num_nodes_before: int
    """``N`` before the batch; new nodes are ``N … N+k-1``."""
    new_node_ids: np.ndarray
    """External IDs of the new nodes (int64 ``[k]``)."""
    new_features: np.ndarray
    """float32 ``[k, F]``."""
    remove_src: np.ndarray
    remove_dst: np.ndarray
    add_src: np.ndarray
    add_dst: np.ndarray
    set_nodes: np.ndarray
    """Storage ids whose features are replaced (unique; the last row given wins)."""
    set_features: np.ndarray
    """float32 ``[len(set_nodes), F]``."""
    idempotency_key: str = ""
    add_edge_weight: np.ndarray | None = None
    """float32 ``[len(add_src)]`` when the graph holds an edge weight column, else ``None``."""
    add_edge_features: np.ndarray | None = None
    """float32 ``[len(add_src), d_e]`` when the graph holds edge features, else ``None``."""
    add_edge_type: np.ndarray | None = None
    """int16 ``[len(add_src)]`` relation ids when the graph has typed edges, else ``None``."""
    new_node_type: np.ndarray | None = None
    """int64 ``[1]``: the type index of the new nodes on a typed graph, else ``None``."""
    new_type_node_ids: np.ndarray | None = None
    """int64 ``[k]``: the new nodes' IDs within their type, on a typed graph, else ``None``."""


def _rows(values: np.ndarray | None, n: int, dim: int, what: str) -> np.ndarray:
    if values is None:
        if n:
            raise InvalidUpdateError(f"{what}: {n} node(s) given without features")
        return np.zeros((0, dim), dtype=np.float32)
    try:
        arr = np.asarray(values)
    except ValueError as err:  # ragged rows
        raise InvalidUpdateError(f"{what}: features are not a [{n}, {dim}] array ({err})") from None
    if arr.ndim != 2 or arr.shape[0] != n:
        raise InvalidUpdateError(
            f"{what}: features have shape {list(arr.shape)}, expected [{n}, {dim}]"
        )
    if arr.shape[1] != dim:
        raise InvalidUpdateError(
            f"{what}: feature width {arr.shape[1]} does not match the graph's {dim}"
        )
    if arr.dtype.kind != "f":
        raise InvalidUpdateError(f"{what}: features must be floating point, got {arr.dtype}")
    return _finite_float32(arr, lambda i: f"{what}[{i}]: features hold NaN or Inf")


def _finite_float32(arr: np.ndarray, message: Callable[[int], str]) -> np.ndarray:
    """``arr`` as contiguous float32, refused with ``message(i)`` at the first row ``i``
    holding NaN or Inf (values beyond float32's range become Inf, so they are refused too)."""
    with np.errstate(over="ignore", invalid="ignore"):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(arr)
    if arr.ndim > 1:
        finite = finite.all(axis=tuple(range(1, arr.ndim)))
    if not finite.all():
        raise InvalidUpdateError(message(int(np.flatnonzero(~finite)[0])))
    return arr


def _edge_weight(values: object, graph, n: int) -> np.ndarray | None:  # noqa: ANN001
    """The added edges' weights as float32 ``[n]``, or ``None`` on a graph without the
    column (see :func:`resolve` for what is refused)."""
    given = values is not None and not (np.size(values) == 0 and n == 0)
    if not graph.meta.has_edge_weight:
        if given:
            raise InvalidUpdateError(
                f"add_edges.weights: the graph holds no edge weights, but {np.size(values)} "
                "were given (refused, not dropped)"
            )
        return None
    if values is None:
        if n:
            raise InvalidUpdateError(
                f"add_edges.weights: the graph holds an edge weight per edge, but the "
                f"{n} added edge(s) were given none"
            )
        return np.zeros(0, dtype=np.float32)
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InvalidUpdateError(
            f"add_edges.weights: shape {list(arr.shape)}, expected one weight per added edge [{n}]"
        )
    if arr.size and arr.dtype.kind not in "fiu":
        raise InvalidUpdateError(f"add_edges.weights: must be numbers, got {arr.dtype}")
    return _finite_float32(
        arr, lambda i: f"add_edges.weights[{i}]: the weight of edge {i} is NaN or Inf"
    )


def _edge_features(values: object, graph, n: int) -> np.ndarray | None:  # noqa: ANN001
    """The added edges' feature rows as float32 ``[n, d_e]``, or ``None`` on a graph
    without edge features (see :func:`resolve` for what is refused)."""
    d_e = graph.meta.edge_feature_dim
    given = values is not None and not (np.size(values) == 0 and n == 0)
    if d_e is None:
        if given:
            raise InvalidUpdateError(
                "add_edges.features: the graph holds no edge features, but "
                f"{np.shape(values)[0] if np.ndim(values) else np.size(values)} row(s) were "
                "given (refused, not dropped)"
            )
        return None
    if values is None:
        if n:
            raise InvalidUpdateError(
                f"add_edges.features: the graph holds {d_e} edge features per edge, but the "
                f"{n} added edge(s) were given none"
            )
        return np.zeros((0, d_e), dtype=np.float32)
    try:
        arr = np.asarray(values)
    except ValueError as err:  # ragged rows
        raise InvalidUpdateError(f"add_edges.features: not a [{n}, {d_e}] array ({err})") from None
    if arr.ndim != 2 or arr.shape[0] != n:
        raise InvalidUpdateError(
            f"add_edges.features: shape {list(arr.shape)}, expected one row per added edge "
            f"[{n}, {d_e}]"
        )
    if arr.shape[1] != d_e:
        raise InvalidUpdateError(
            f"add_edges.features: width {arr.shape[1]} given, the graph's edge feature "
            f"width is {d_e}"
        )
    if arr.size and arr.dtype.kind not in "fiu":
        raise InvalidUpdateError(f"add_edges.features: must be numbers, got {arr.dtype}")
    return _finite_float32(
        arr, lambda i: f"add_edges.features[{i}]: the features of edge {i} hold NaN or Inf"
    )


def _edge_type(values: object, graph, n: int, what: str = "add_edges") -> np.ndarray | None:  # noqa: ANN001
    """The ``what`` edges' relation ids as int16 ``[n]``, or ``None`` on a graph without
    typed edges (see :func:`resolve` for what is refused)."""
    from hopserve.worker.graph.relations import relation_ids

    names = graph.meta.relations
    edges = {"add_edges": "added edge", "remove_edges": "removed edge"}[what]
    given = values is not None and not (np.size(values) == 0 and n == 0)
    if names is None:
        if given:
            raise InvalidUpdateError(
                f"{what}.relations: the graph has no typed edges, but {np.size(values)} "
                "relation(s) were given (refused, not dropped)"
            )
        return None
    if values is None or (np.size(values) == 0 and n):
        if n:
            raise InvalidUpdateError(
                f"{what}.relations: the graph's edges are typed ({', '.join(names[:8])}), "
                f"but the {n} {edges}(s) name no relation"
            )
        return np.zeros(0, dtype=np.int16)
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InvalidUpdateError(
            f"{what}.relations: shape {list(arr.shape)}, expected one relation per {edges} [{n}]"
        )
    try:
        ids, _ = relation_ids(arr, names)
    except ValueError as err:
        raise InvalidUpdateError(f"{what}.relations: {err}") from None
    return ids


@dataclass(frozen=True)
class _NewTyped:
    """The typed nodes a batch adds: their type, own IDs and store-wide IDs."""

    type_index: int
    name: str
    own_ids: np.ndarray
    store_wide: np.ndarray


def _new_typed_nodes(graph, batch: MutationBatch) -> _NewTyped | None:  # noqa: ANN001
    """Check the batch's new nodes against the graph's node types: on a typed graph they
    name their type and are new IDs within it (``None`` when the batch adds no typed
    nodes); on an untyped one they name none."""
    types = graph.meta.node_types
    ids = batch.add_node_ids
    if types is None:
        if batch.add_node_type:
            raise InvalidUpdateError(
                f"add_nodes.node_type: {batch.add_node_type!r} given, but the graph's nodes "
                "are untyped"
            )
        return None
    if not ids.size:
        if batch.add_node_type:
            raise InvalidUpdateError(
                f"add_nodes.node_type: {batch.add_node_type!r} given without nodes to add"
            )
        return None
    names = ", ".join(t.name for t in types)
    if graph.type_node_ids is None:
        raise InvalidUpdateError(
            f"add_nodes: the graph's node types ({names}) are numbered by position "
            "0..count-1, so an added node could be named by no ID of its type; a typed "
            "graph takes new nodes where its types have their own IDs (build the store with "
            "them: node_ids_dict, ingest's per-type ID files)"
        )
    if not batch.add_node_type:
        raise InvalidUpdateError(
            f"add_nodes.node_type: the graph's nodes are typed ({names}); name the type of "
            "the added nodes"
        )
    try:
        t = graph.node_type(batch.add_node_type)
    except KeyError as err:
        raise InvalidUpdateError(f"add_nodes.node_type: {err.args[0]}") from None
    _, found = graph.find_typed(ids, t.name)
    if found.any():
        i = int(np.flatnonzero(found)[0])
        raise InvalidUpdateError(
            f"add_nodes[{i}]: node ID {int(ids[i])} is already a {t.name!r} node"
        )
    n = graph.num_nodes
    return _NewTyped(
        type_index=[u.name for u in types].index(t.name),
        name=t.name,
        own_ids=ids,
        store_wide=np.arange(n, n + ids.size, dtype=np.int64),
    )


def _typed_rows(values: object, graph, new: _NewTyped) -> np.ndarray:  # noqa: ANN001
    """The new typed nodes' feature rows at the graph's width: given at that width (the
    columns past the type's own zero) or at the type's (padded with zeros)."""
    dim = graph.feature_dim
    width = graph.node_type(new.name).feature_dim
    arr = np.asarray(values) if values is not None else None
    if arr is not None and arr.ndim == 2 and arr.shape[1] == width != dim:
        rows = _rows(arr, new.own_ids.size, width, "add_nodes")
        return np.pad(rows, ((0, 0), (0, dim - width)))
    if arr is not None and arr.ndim == 2 and arr.shape[1] not in (width, dim):
        raise InvalidUpdateError(
            f"add_nodes: feature width {arr.shape[1]} matches neither the graph's {dim} nor "
            f"the {new.name!r} type's {width}"
        )
    rows = _rows(values, new.own_ids.size, dim, "add_nodes")
    beyond = np.flatnonzero((rows[:, width:] != 0).any(axis=1))
    if beyond.size:
        raise InvalidUpdateError(
            f"add_nodes[{int(beyond[0])}]: a {new.name!r} node has {width} feature columns, "
            f"but the row holds non-zero values past them (of the graph's {dim})"
        )
    return rows


def _check_typed_id_mutations(meta, batch: MutationBatch) -> None:  # noqa: ANN001 - a GraphMeta
    """On a store whose node types have their own IDs, a node is named by its type and ID:
    removals must name each edge's relation and feature updates their node type, rather
    than be read as store-wide IDs."""
    names = ", ".join(t.name for t in meta.node_types)
    if batch.remove_src.size and batch.remove_edge_type is None:
        raise InvalidUpdateError(
            f"remove_edges: the graph's node types ({names}) have their own node IDs: name "
            "each removed edge's relation (its ends are read in the relation's types)"
        )
    if batch.set_node_ids.size and not batch.set_node_type:
        raise InvalidUpdateError(
            f"set_features: the graph's node types ({names}) have their own node IDs: name "
            "the node type of the IDs (set_features.node_type)"
        )


def _typed_ends(graph, src, dst, relation: np.ndarray, what: str, new: _NewTyped | None = None):  # noqa: ANN001, ANN202
    """Storage ids of edges' ends, each read as an ID within its relation's source and
    destination type (naming the first edge whose end its type lacks); ``new``: nodes
    the batch adds, found by their type and ID too."""
    from hopserve.worker.graph.node_types import relation_triple

    ends = []
    for end, ids, part in (("source", src, 0), ("destination", dst, 2)):
        store_wide = np.full(ids.size, -1, dtype=np.int64)
        bad = np.zeros(ids.size, dtype=bool)
        for r in np.unique(relation).tolist():
            on = np.flatnonzero(relation == r)
            node_type = relation_triple(graph.meta.relations[r])[part]
            store_wide[on], found = _find_typed(graph, ids[on], node_type, new)
            bad[on] = ~found
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            name = graph.meta.relations[relation[i]]
            raise InvalidUpdateError(
                f"{what}[{i}]: the {end} {int(ids[i])} of a {name!r} edge is not a "
                f"{relation_triple(name)[part]!r} node ID"
            )
        ends.append(_storage_of(graph, store_wide, new))
    return ends[0], ends[1]


def _find_typed(
    graph,
    ids: np.ndarray,
    node_type: str,
    new: _NewTyped | None,  # noqa: ANN001
) -> tuple[np.ndarray, np.ndarray]:
    """``(store-wide IDs, found)`` of IDs within ``node_type`` (``-1`` where the type has no
    such ID), the batch's ``new`` nodes of that type included.

    Raises:
        KeyError: no such type.
    """
    store_wide, found = graph.find_typed(ids, node_type)
    if new is not None and node_type == new.name and not found.all():
        miss = np.flatnonzero(~found)
        at, hit = IdIndex(new.own_ids, new.own_ids.size).find(ids[miss])
        store_wide[miss[hit]] = new.store_wide[at[hit]]
        found[miss[hit]] = True
    return store_wide, found


def _storage_of(graph, store_wide: np.ndarray, new: _NewTyped | None) -> np.ndarray:  # noqa: ANN001
    """Storage ids of store-wide IDs, the batch's new nodes (``N, N+1, …``) included."""
    if new is None:
        return graph.to_storage(store_wide)
    out = store_wide.copy()  # a new node's storage id is its store-wide ID
    old = store_wide < graph.num_nodes
    out[old] = graph.to_storage(store_wide[old])
    return out


def _check_removed_relations(graph, src, dst, relation, batch: MutationBatch) -> None:  # noqa: ANN001
    """Each removed pair is an edge of the relation it names (the pair then goes under
    every relation; naming the first that is not)."""
    for i, (s, d, r) in enumerate(zip(src.tolist(), dst.tolist(), relation.tolist(), strict=True)):
        a, b = int(graph.indptr[d]), int(graph.indptr[d + 1])
        on = np.flatnonzero(np.asarray(graph.indices[a:b]) == s) + a
        if not (np.asarray(graph.edge_type)[on] == r).any():
            raise InvalidUpdateError(
                f"remove_edges[{i}]: {int(batch.remove_src[i])} -> {int(batch.remove_dst[i])} "
                f"is not a {graph.meta.relations[r]!r} edge of the graph"
            )


def _typed_nodes(
    graph,
    ids: np.ndarray,
    node_type: str,
    what: str,
    new: _NewTyped | None = None,  # noqa: ANN001
) -> np.ndarray:
    """Storage ids of IDs within ``node_type`` (naming an unknown type or the first ID the
    type lacks); ``new``: nodes the batch adds, found by their type and ID too."""
    if graph.meta.node_types is None:
        raise InvalidUpdateError(
            f"{what}.node_type: {node_type!r} given, but the graph's nodes are untyped"
        )
    try:
        store_wide, found = _find_typed(graph, ids, node_type, new)
    except KeyError as err:
        raise InvalidUpdateError(f"{what}.node_type: {err.args[0]}") from None
    if not found.all():
        i = int(np.flatnonzero(~found)[0])
        raise InvalidUpdateError(f"{what}[{i}]: {int(ids[i])} is not a {node_type!r} node ID")
    return _storage_of(graph, store_wide, new)


def _check_typed_ends(
    graph, src, dst, relation, batch: MutationBatch, new: _NewTyped | None
) -> None:  # noqa: ANN001
    """Each added edge joins nodes of its relation's types (named at the first that does
    not); ``src``/``dst`` are storage ids, the batch's new nodes ``N, N+1, …`` included."""
    from hopserve.worker.graph.node_types import relation_triple, type_of

    meta = graph.meta
    names = [t.name for t in meta.node_types]
    n = graph.num_nodes
    for end, ids, part in (("source", src, 0), ("destination", dst, 2)):
        kinds = type_of(meta.node_types, np.minimum(ids, max(n - 1, 0)))
        if new is not None:
            kinds[ids >= n] = new.type_index
        want = np.array(
            [names.index(relation_triple(r)[part]) for r in meta.relations], dtype=np.int64
        )[relation]
        bad = np.flatnonzero(kinds != want)
        if bad.size:
            i = int(bad[0])
            t = meta.node_types[want[i]]
            value = int((batch.add_src if end == "source" else batch.add_dst)[i])
            raise InvalidUpdateError(
                f"add_edges[{i}]: the {end} {value} of a {meta.relations[relation[i]]!r} edge "
                f"is not a {t.name!r} node (store-wide IDs {t.offset}..{t.offset + t.count - 1})"
            )


def resolve(batch: MutationBatch, graph, seq: int) -> ResolvedBatch:  # graph: GraphSnapshot
    """Check ``batch`` against ``graph`` (a snapshot) and map it to storage ids.

    Raises:
        InvalidUpdateError: the first problem found, naming the mutation: an unknown
            endpoint, a duplicate or existing new ID, a pair to remove that is not an
            edge, a wrong feature width, NaN/Inf, mismatched lengths, a bad key; added
            edges without the weight / feature row the graph's edge columns need (named
            field and count), a wrong edge feature width (expected and given), NaN/Inf
            edge data (edge index), edge data for a column the graph lacks; on a graph
            with typed edges, added edges without a relation or with an unknown one; on a
            graph with node types, new nodes without their type, of an unknown type, with
            an ID the type has, with non-zero values past the type's feature columns, or
            on a store whose types are numbered by position.
    """
    key = batch.idempotency_key
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise InvalidUpdateError(
            f"idempotency_key must be at most {MAX_KEY_CHARS} printable characters"
        )
    n, dim = graph.num_nodes, graph.feature_dim
    if graph.type_node_ids is not None:
        _check_typed_id_mutations(graph.meta, batch)
    new_ids = batch.add_node_ids
    dup = first_duplicate(new_ids)
    if dup is not None:
        raise InvalidUpdateError(
            f"add_nodes[{dup[0]}]: node ID {int(new_ids[dup[0]])} is given twice "
            f"(also add_nodes[{dup[1]}])"
        )
    typed = _new_typed_nodes(graph, batch)
    if typed is not None:  # new IDs within their type; store-wide N, N+1, ...
        new_rows = _typed_rows(batch.add_node_features, graph, typed)
        new_ids = typed.store_wide
    else:
        found = graph.find(new_ids)[1] if new_ids.size else np.zeros(0, dtype=bool)
        if found.any():
            i = int(np.flatnonzero(found)[0])
            raise InvalidUpdateError(
                f"add_nodes[{i}]: node ID {int(new_ids[i])} is already in the graph"
            )
        new_rows = _rows(batch.add_node_features, new_ids.size, dim, "add_nodes")
    order = np.argsort(new_ids, kind="stable")
    sorted_new = new_ids[order]

    def storage(ids: np.ndarray, what: str, allow_new: bool) -> np.ndarray:
        out, found = graph.find(ids)
        if allow_new and sorted_new.size and not found.all():
            miss = np.flatnonzero(~found)
            pos = np.minimum(np.searchsorted(sorted_new, ids[miss]), sorted_new.size - 1)
            hit = sorted_new[pos] == ids[miss]
            out[miss[hit]] = n + order[pos[hit]]
            found[miss[hit]] = True
        if not found.all():
            i = int(np.flatnonzero(~found)[0])
            raise InvalidUpdateError(f"{what}[{i}]: node ID {int(ids[i])} is not in the graph")
        return out

    for name, src, dst in (
        ("remove_edges", batch.remove_src, batch.remove_dst),
        ("add_edges", batch.add_src, batch.add_dst),
    ):
        if src.size != dst.size:
            raise InvalidUpdateError(f"{name}: {src.size} sources but {dst.size} destinations")
    add_weight = _edge_weight(batch.add_edge_weight, graph, batch.add_src.size)
    add_edge_features = _edge_features(batch.add_edge_features, graph, batch.add_src.size)
    add_edge_type = _edge_type(batch.add_edge_type, graph, batch.add_src.size)
    if batch.remove_edge_type is not None:  # ends named within their relation's types
        if graph.meta.node_types is None:
            raise InvalidUpdateError(
                "remove_edges.relations: the graph's nodes are untyped; removing src -> dst "
                "removes it under every relation (name no relation)"
            )
        relation = _edge_type(batch.remove_edge_type, graph, batch.remove_src.size, "remove_edges")
        r_src, r_dst = _typed_ends(
            graph, batch.remove_src, batch.remove_dst, relation, "remove_edges"
        )
    else:
        r_src = storage(batch.remove_src, "remove_edges.src", False)
        r_dst = storage(batch.remove_dst, "remove_edges.dst", False)
    if r_src.size and batch.remove_edge_type is not None:
        _check_removed_relations(graph, r_src, r_dst, relation, batch)
    if r_src.size:
        exists = graph.has_edges(r_src, r_dst)
        if not exists.all():
            i = int(np.flatnonzero(~exists)[0])
            raise InvalidUpdateError(
                f"remove_edges[{i}]: {int(batch.remove_src[i])} -> {int(batch.remove_dst[i])} "
                "is not an edge of the graph"
            )
    if graph.type_node_ids is not None:  # ends named in their relation's types' own IDs
        a_src, a_dst = _typed_ends(
            graph, batch.add_src, batch.add_dst, add_edge_type, "add_edges", typed
        )
    else:
        a_src = storage(batch.add_src, "add_edges.src", True)
        a_dst = storage(batch.add_dst, "add_edges.dst", True)
    if graph.meta.node_types is not None:
        _check_typed_ends(graph, a_src, a_dst, add_edge_type, batch, typed)
    if batch.set_node_type:
        set_nodes = _typed_nodes(
            graph, batch.set_node_ids, batch.set_node_type, "set_features", typed
        )
    else:
        set_nodes = storage(batch.set_node_ids, "set_features", True)
    set_rows = _rows(batch.set_features, set_nodes.size, dim, "set_features")
    if set_nodes.size:  # the last row given for a node wins
        last = set_nodes.size - 1 - np.unique(set_nodes[::-1], return_index=True)[1]
        set_nodes, set_rows = set_nodes[last], set_rows[last]
    return ResolvedBatch(
        seq=seq,
        num_nodes_before=n,
        new_node_ids=new_ids,
        new_features=new_rows,
        remove_src=r_src,
        remove_dst=r_dst,
        add_src=a_src,
        add_dst=a_dst,
        set_nodes=set_nodes,
        set_features=set_rows,
        idempotency_key=key,
        add_edge_weight=add_weight,
        add_edge_features=add_edge_features,
        add_edge_type=add_edge_type,
        new_node_type=None if typed is None else np.array([typed.type_index], np.int64),
        new_type_node_ids=None if typed is None else typed.own_ids,
    )


# ---------------------------------------------------------------------------- log bytes
_ARRAYS = (
    "new_node_ids", "new_features", "remove_src", "remove_dst", "add_src", "add_dst",
    "set_nodes", "set_features",
)  # fmt: skip
_HEAD = struct.Struct("<QQI")  # seq, num_nodes_before, key length
_ARRAY = struct.Struct("<BQQ")  # dtype code, rows, columns (0 = 1-D)
_DTYPES = {1: np.dtype("<i8"), 2: np.dtype("<f4")}
_CODES = {v: k for k, v in _DTYPES.items()}


_EDGE_MAGIC = b"HSED"  # the trailer: magic, flags, then the flagged arrays
_EDGE_FLAGS = struct.Struct("<B")
_EDGE_ARRAYS = (
    (1, "add_edge_weight"),
    (2, "add_edge_features"),
    (4, "add_edge_type"),
    (8, "new_node_type"),
    (16, "new_type_node_ids"),
)  # (flag bit, field); int arrays are stored as int64 and typed by the snapshot


def _pack(arr: np.ndarray, parts: list[bytes]) -> None:
    dtype = np.dtype("<f4") if arr.dtype.kind == "f" else np.dtype("<i8")
    arr = np.ascontiguousarray(arr, dtype=dtype)
    cols = arr.shape[1] if arr.ndim == 2 else 0
    parts.append(_ARRAY.pack(_CODES[dtype], arr.shape[0], cols))
    parts.append(arr.tobytes())


def encode(batch: ResolvedBatch) -> bytes:
    """The batch as log bytes (resolved: replaying it needs no ID lookups).

    The edge trailer is written only when the batch carries edge data (the graph holds
    edge columns), so a batch without any encodes as before the trailer existed.
    """
    key = batch.idempotency_key.encode()
    parts = [_HEAD.pack(batch.seq, batch.num_nodes_before, len(key)), key]
    for name in _ARRAYS:
        _pack(getattr(batch, name), parts)
    flags = sum(bit for bit, name in _EDGE_ARRAYS if getattr(batch, name) is not None)
    if flags:
        parts += [_EDGE_MAGIC, _EDGE_FLAGS.pack(flags)]
        for bit, name in _EDGE_ARRAYS:
            if flags & bit:
                _pack(getattr(batch, name), parts)
    return b"".join(parts)


def decode(data: bytes, dim: int) -> ResolvedBatch:
    """Inverse of :func:`encode`.

    Raises:
        ValueError: the bytes are not a batch (a corrupt record).
    """
    try:
        return _decode(memoryview(data), dim)
    except struct.error as err:  # a header cut short
        raise ValueError(f"log record: {err}") from None


def _decode(view: memoryview, dim: int) -> ResolvedBatch:
    seq, n_before, key_len = _HEAD.unpack_from(view, 0)
    at = _HEAD.size
    if at + key_len > len(view):
        raise ValueError("log record: the key runs past the record")
    key = bytes(view[at : at + key_len]).decode()
    at += key_len
    values = {}
    for name in _ARRAYS:
        values[name], at = _unpack(view, at, name)
    if at < len(view):  # the edge trailer (records before it have none)
        end = at + len(_EDGE_MAGIC)
        if bytes(view[at:end]) != _EDGE_MAGIC:
            raise ValueError("log record: trailing bytes")
        (flags,) = _EDGE_FLAGS.unpack_from(view, end)
        at = end + _EDGE_FLAGS.size
        if not flags or flags & ~sum(bit for bit, _ in _EDGE_ARRAYS):
            raise ValueError(f"log record: bad edge trailer flags {flags}")
        for bit, name in _EDGE_ARRAYS:
            if flags & bit:
                values[name], at = _unpack(view, at, name)
    if at != len(view):
        raise ValueError("log record: trailing bytes")
    for name in ("new_features", "set_features"):
        if values[name].ndim == 1:  # no rows: keep the [0, dim] shape
            values[name] = values[name].reshape(0, dim)
    return ResolvedBatch(seq=seq, num_nodes_before=n_before, idempotency_key=key, **values)


def _unpack(view: memoryview, at: int, name: str) -> tuple[np.ndarray, int]:
    """The array whose header is at ``at`` and where the next one starts."""
    code, rows, cols = _ARRAY.unpack_from(view, at)
    at += _ARRAY.size
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise ValueError(f"log record: array {name} has unknown dtype code {code}")
    nbytes = rows * (cols or 1) * dtype.itemsize
    if at + nbytes > len(view):
        raise ValueError(f"log record: array {name} runs past the record")
    arr = np.frombuffer(view[at : at + nbytes], dtype=dtype).copy()
    return (arr.reshape(rows, cols) if cols else arr), at + nbytes
