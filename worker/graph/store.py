"""GraphStore: a CSC graph with node features, opened zero-copy from a graph-store directory.

Arrays are torch tensors over numpy copy-on-write memmaps (``np.load(mmap_mode="c")``) when
opened from disk: nothing is read until touched, features are never loaded whole, and
in-place writes never reach the files. Everything is in STORAGE order; external node IDs
map to storage indices with :meth:`GraphStore.to_storage` (see :mod:`~.ids`). The on-disk
layout is described in :mod:`~.format`.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hopserve.worker.graph.build import build_csc, validate_labels, validate_node_ids
from hopserve.worker.graph.contents import (
    ArrayFeatures,
    GraphArrays,
    StoreContents,
    contents_from_csc,
    materialize,
    write_contents,
)
from hopserve.worker.graph.errors import GraphFormatError
from hopserve.worker.graph.format import (
    FEATURES_FILE,
    LABELS_FILE,
    GraphMeta,
    load_array,
)
from hopserve.worker.graph.node_types import check_node_types, type_of
from hopserve.worker.graph.relation_csc import RelationCSC
from hopserve.worker.graph.topology import GraphTopology

__all__ = ["GraphStore"]

log = logging.getLogger(__name__)


def _tensor(arr: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Zero-copy tensor over a numpy array (copies only read-only inputs)."""
    if isinstance(arr, torch.Tensor):
        return arr
    return torch.from_numpy(_writable(arr))


def _writable(arr: np.ndarray | torch.Tensor) -> np.ndarray:
    """A numpy array torch can share: CPU tensors as their numpy view, read-only arrays
    copied (memmaps opened copy-on-write are writable and stay zero-copy)."""
    if isinstance(arr, torch.Tensor):
        return arr.detach().cpu().numpy()
    return arr if arr.flags.writeable else arr.copy()


def _numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class GraphStore:
    """A graph in CSC form (in-edges grouped by destination), features and optional labels.

    Attributes:
        num_nodes, num_edges, feature_dim: sizes.
        indptr: int64 ``[N+1]``; in-neighbours of storage node ``v`` are
            ``indices[indptr[v]:indptr[v+1]]`` (ascending).
        indices: int32 (``N < 2**31``) or int64 ``[E]``.
        features: float32/float16 ``[N, F]``.
        labels: int64 ``[N]`` (``-1`` = unlabeled) or ``None``.
        node_ids: int64 ``[N]`` external ID per storage node, or ``None`` (identity).
        edge_weight: float32 ``[E]`` weight per edge in CSC order (entry ``k`` belongs to
            ``indices[k]``), or ``None``.
        edge_features: float32 ``[E, d_e]`` features per edge in CSC order, or ``None``.
        edge_type: int16 ``[E]`` relation id per edge in CSC order, or ``None``;
            :attr:`relations` names the ids.
        version: content-hash version id from the meta.
        ordering: ``"rcmk"`` or ``"identity"``.
        path: the directory it was opened from, or ``None`` when built in memory.
        meta: the validated :class:`~.format.GraphMeta`.
    """

    def __init__(
        self,
        *,
        meta: GraphMeta,
        indptr: np.ndarray | torch.Tensor,
        indices: np.ndarray | torch.Tensor,
        features: np.ndarray | torch.Tensor,
        labels: np.ndarray | torch.Tensor | None = None,
        node_ids: np.ndarray | torch.Tensor | None = None,
        path: str | Path | None = None,
        topology: GraphTopology | None = None,
        edge_weight: np.ndarray | torch.Tensor | None = None,
        edge_features: np.ndarray | torch.Tensor | None = None,
        edge_type: np.ndarray | torch.Tensor | None = None,
        type_node_ids: np.ndarray | None = None,
        per_request: bool = False,
    ) -> None:
        # ``topology``: an existing view of the same arrays (a living graph's snapshot,
        # with its degrees, ID index and edge columns carried over) instead of a new one.
        self.topology = topology or GraphTopology(
            meta,
            _writable(indptr),
            _writable(indices),
            None if node_ids is None else _writable(node_ids),
            path,
            edge_weight=None if edge_weight is None else _writable(edge_weight),
            edge_features=None if edge_features is None else _writable(edge_features),
            edge_type=None if edge_type is None else _writable(edge_type),
            type_node_ids=None if type_node_ids is None else _writable(type_node_ids),
        )
        topo = self.topology
        self.meta = meta
        self.indptr = torch.from_numpy(topo.indptr)  # zero-copy views of the topology
        self.indices = torch.from_numpy(topo.indices)
        self.node_ids = None if topo.node_ids is None else torch.from_numpy(topo.node_ids)
        ew, ef = topo.edge_weight, topo.edge_features
        self.edge_weight = None if ew is None else torch.from_numpy(ew)
        self.edge_features = None if ef is None else torch.from_numpy(ef)
        et = topo.edge_type
        self.edge_type = None if et is None else torch.from_numpy(et)
        self.per_request = per_request  # made for one request: no per-graph indexes
        self._relation_csc: RelationCSC | None = None
        self._relation_csc_lock = threading.Lock()
        self.features = _tensor(features)
        self.labels = None if labels is None else _tensor(labels)
        self.path = topo.path
        self.num_nodes = meta.num_nodes
        self.num_edges = meta.num_edges
        self.feature_dim = meta.feature_dim
        self.version = meta.version
        self.ordering = meta.ordering
        n, f = self.num_nodes, self.feature_dim
        where = str(self.path) if self.path else "GraphStore"
        for ok, what in (
            (tuple(self.features.shape) == (n, f), f"features shape {list(self.features.shape)}"),
            (self.labels is None or tuple(self.labels.shape) == (n,), "labels shape"),
        ):
            if not ok:
                raise GraphFormatError(f"{where}: {what} inconsistent with meta (N={n}, F={f})")

    # ------------------------------------------------------------------ construction
    @classmethod
    def open(cls, path: str | Path, *, mmap: bool = True) -> GraphStore:
        """Open a graph-store directory (memory-mapped copy-on-write unless ``mmap=False``).

        Raises:
            GraphFormatError: missing/invalid meta or arrays (message names the file).
        """
        topo = GraphTopology.open(path, mmap=mmap)
        meta = topo.meta
        n, f = meta.num_nodes, meta.feature_dim
        features = load_array(
            path, FEATURES_FILE, mmap=mmap, dtype=np.dtype(meta.feature_dtype), shape=(n, f)
        )
        labels = (
            load_array(path, LABELS_FILE, mmap=mmap, dtype=np.int64, shape=(n,))
            if meta.has_labels
            else None
        )
        store = cls(
            meta=meta,
            indptr=topo.indptr,
            indices=topo.indices,
            features=features,
            labels=labels,
            node_ids=topo.node_ids,
            path=path,
            topology=topo,
        )
        log.debug("opened %r", store)
        return store

    @classmethod
    def _from_arrays(cls, arrays: GraphArrays) -> GraphStore:
        return cls(
            meta=arrays.meta,
            indptr=arrays.indptr,
            indices=arrays.indices,
            features=arrays.features,
            labels=arrays.labels,
            node_ids=arrays.node_ids,
            edge_weight=arrays.edge_weight,
            edge_features=arrays.edge_features,
            edge_type=arrays.edge_type,
            type_node_ids=arrays.type_node_ids,
        )

    @classmethod
    def from_edge_index(
        cls,
        edge_index: Any,
        x: Any,
        *,
        labels: Any | None = None,
        node_ids: Any | None = None,
        reorder: str | None = "rcmk",
        symmetrize: bool = False,
        add_self_loops: bool = False,
        dedup: bool = False,
        progress: bool = False,
        edge_weight: Any | None = None,
        edge_attr: Any | None = None,
        edge_type: Any | None = None,
        relations: list[str] | None = None,
        node_types: list[Any] | None = None,
    ) -> GraphStore:
        """Build an in-memory store from a ``[2, E]`` edge index (``edge_index[0]`` = source).

        Endpoints are row indices of ``x``. The caller's numbering stays the external ID
        space: ``node_ids`` (external ID of each row of ``x``) if given, else the row index.
        With ``reorder=None`` and no ``node_ids`` the store is identity-ordered, ``node_ids``
        is ``None`` and a float32/float16 contiguous CPU ``x`` is used without a copy.

        ``edge_weight`` ``[E]`` and ``edge_attr`` ``[E, d_e]`` (column ``e`` of
        ``edge_index`` owns row ``e``; a ``[E, 1]`` weight is flattened, a ``[E]`` ``edge_attr``
        is one feature per edge, ``[E, 1]``) are stored as
        float32 :attr:`edge_weight` / :attr:`edge_features` in CSC order; ``symmetrize``
        gives each reverse edge it adds its mirror's rows; they rule out ``add_self_loops``
        and ``dedup``. ``edge_type`` ``[E]`` (relation ids, or names) is stored the same
        way as :attr:`edge_type`; ``relations`` names the ids (default ``"0".."R-1"``,
        or the sorted names). ``node_types`` (:class:`~.node_types.NodeTypeInfo` per type,
        in id order, covering the rows) makes a typed store; ``reorder`` runs within each
        type's rows.

        Raises:
            ValueError: bad shapes, dtypes, out-of-range endpoints, duplicate ``node_ids``,
                non-finite edge data (naming the first bad edge).
        """
        ei = _numpy(edge_index)
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {list(ei.shape)}")
        x_is_tensor = isinstance(x, torch.Tensor)
        x_np = _numpy(x)
        if x_np.ndim != 2:
            raise ValueError(f"x must have shape [N, F], got {list(x_np.shape)}")
        n = x_np.shape[0]
        lab = None if labels is None else validate_labels(_numpy(labels), n)
        ids = None if node_ids is None else validate_node_ids(_numpy(node_ids), n)
        ew = None if edge_weight is None else _numpy(edge_weight)
        if ew is not None and ew.ndim == 2 and ew.shape[1] == 1:
            ew = ew.reshape(-1)
        ea = None if edge_attr is None else _numpy(edge_attr)
        if ea is not None and ea.ndim == 1:  # one feature per edge
            ea = ea.reshape(-1, 1)
        groups = None
        if node_types is not None:
            node_types = check_node_types(node_types, n, x_np.shape[1])
            groups = type_of(node_types, np.arange(n))  # reorder within each type's ranges
        csc = build_csc(
            ei[0],
            ei[1],
            n,
            node_groups=groups,
            symmetrize=symmetrize,
            add_self_loops=add_self_loops,
            dedup=dedup,
            reorder=reorder,
            progress=progress,
            track_edges=ew is not None or ea is not None or edge_type is not None,
        )
        contents = contents_from_csc(
            csc,
            x_np,
            labels=lab,
            node_ids=ids,
            edge_weight=ew,
            edge_features=ea,
            edge_type=None if edge_type is None else _numpy(edge_type),
            relations=relations,
            node_types=node_types,
        )
        arrays = materialize(contents, progress=progress)
        if x_is_tensor and arrays.features is x_np:
            arrays.features = x.detach()  # keep the caller's tensor object (no copy)
        return cls._from_arrays(arrays)

    @classmethod
    def from_pyg(cls, data: Any, *, edge_data: bool = True, **kw: Any) -> GraphStore:
        """Build from a ``torch_geometric.data.Data`` (``edge_index``, ``x``, optional ``y``,
        ``edge_weight``, ``edge_attr``, ``edge_type``).

        ``y`` becomes labels when it is an integer tensor of shape ``[N]`` or ``[N, 1]``;
        pass ``labels=`` to override. ``data.edge_weight`` ``[E]`` becomes the store's edge
        weights and ``data.edge_attr`` ``[E, d_e]`` (or ``[E]``: one feature) its edge
        features, what a model's ``forward(x, edge_index, edge_weight)`` /
        ``forward(x, edge_index, edge_attr)`` is served with; ``data.edge_type`` ``[E]``
        its relation ids (``RGCNConv``'s ``edge_type``). ``edge_data=False`` leaves them
        out (or pass ``edge_weight=`` / ``edge_attr=`` / ``edge_type=`` yourself). Other
        keywords go to :meth:`from_edge_index`.
        """
        if hasattr(data, "node_types") and hasattr(data, "edge_index_dict"):  # HeteroData
            return cls._from_pyg_hetero(data, edge_data=edge_data, **kw)
        if getattr(data, "x", None) is None or getattr(data, "edge_index", None) is None:
            raise ValueError("data must have x and edge_index")
        if edge_data:
            for key in ("edge_weight", "edge_attr", "edge_type"):
                value = getattr(data, key, None)
                if key not in kw and value is not None:
                    kw[key] = value
        if "labels" not in kw:
            y = getattr(data, "y", None)
            n = data.x.shape[0]
            if isinstance(y, torch.Tensor) and not y.is_floating_point() and y.numel() == n:
                kw["labels"] = y.reshape(-1)
            elif y is not None:
                log.warning("ignoring data.y of shape %s (not integer labels [N])", tuple(y.shape))
        return cls.from_edge_index(data.edge_index, data.x, **kw)

    @classmethod
    def _from_pyg_hetero(cls, data: Any, *, edge_data: bool = True, **kw: Any) -> GraphStore:
        """A typed store from a ``HeteroData`` (``x`` per node type, ``edge_index`` per
        edge type, integer ``y`` per node type as labels; with ``edge_data``, each edge
        type's ``edge_attr`` / ``edge_weight`` when any edge type has one, which every edge
        type must then have)."""
        if edge_data:
            for key in ("edge_attr", "edge_weight"):
                values = {
                    et: getattr(data[et], key)
                    for et in data.edge_types
                    if getattr(data[et], key, None) is not None
                }
                if values and f"{key}_dict" not in kw:
                    kw[f"{key}_dict"] = values
        labels = {}
        for t in data.node_types:
            y = getattr(data[t], "y", None)
            if isinstance(y, torch.Tensor) and not y.is_floating_point() and y.dim() <= 1:
                labels[t] = y
        return cls.from_hetero(
            {t: data[t].x for t in data.node_types if getattr(data[t], "x", None) is not None},
            dict(data.edge_index_dict),
            labels_dict=labels or None,
            num_nodes_dict={t: data[t].num_nodes for t in data.node_types},
            node_types=list(data.node_types),
            **kw,
        )

    @classmethod
    def from_dgl(
        cls,
        g: Any,
        *,
        feature_key: str | None = None,
        label_key: str | None = "label",
        edge_weight_key: str | None = "auto",
        edge_feature_key: str | None = "auto",
        edge_type_key: str | None = "auto",
        **kw: Any,
    ) -> GraphStore:
        """Build from a ``dgl.DGLGraph`` (edges, ``ndata`` features and labels, ``edata``
        weights and features). A heterograph (several node or edge types) becomes a typed
        store (:mod:`~.node_types`: ``feature_key`` per node type, default ``"feat"``;
        ``label_key`` labels; each edge type's ``edata`` weights and features under the
        keys below, which every edge type must then have; the homogeneous form is
        ``dgl.to_homogeneous``'s).

        Node ``i`` of ``g`` keeps external ID ``i`` (unless ``node_ids=`` is given); edge
        direction is DGL's (``g.edges()[0]`` is the source); edge ``e`` keeps its ``edata``
        rows.

        Args:
            g: a homogeneous DGLGraph (one node type, one edge type), on any device.
            feature_key: ``ndata`` key of the ``[N, F]`` features; default ``"feat"``,
                else ``"x"``.
            label_key: ``ndata`` key of integer labels ``[N]`` / ``[N, 1]``; a missing key
                means no labels, a non-integer tensor is ignored with a warning; ``None``
                skips labels.
            edge_weight_key: ``edata`` key of per-edge weights ``[E]`` (or ``[E, 1]``);
                ``"auto"``: the first of ``"weight"``, ``"w"``, ``"edge_weight"`` present;
                ``None``: no weights.
            edge_feature_key: ``edata`` key of edge features ``[E, d_e]``; ``"auto"``:
                the first of ``"feat"``, ``"h"``, ``"edge_attr"`` present; ``None``: none.
            edge_type_key: ``edata`` key of per-edge relation ids ``[E]`` (what
                ``RelGraphConv``'s ``etypes`` takes); ``"auto"``: the first of ``"etype"``,
                ``"rel_type"``, ``"edge_type"``, ``dgl.ETYPE`` (``"_TYPE"``, set by
                ``dgl.to_homogeneous``) present; ``None``: none.
            **kw: passed to :meth:`from_edge_index` (``reorder``, ``symmetrize``,
                ``add_self_loops``, ``dedup``, ``node_ids``, ``progress``, ``labels``).

        Raises:
            ValueError: no usable feature tensor (names the keys).
        """
        ntypes, etypes = list(g.ntypes), list(g.canonical_etypes)
        if len(ntypes) != 1 or len(etypes) != 1:  # a heterograph: a typed store
            key = feature_key or "feat"
            feats = {t: g.nodes[t].data[key] for t in ntypes if key in g.nodes[t].data}
            labels = {
                t: g.nodes[t].data[label_key]
                for t in ntypes
                if label_key and label_key in g.nodes[t].data
            }
            for arg, key, auto in (
                ("edge_weight_dict", edge_weight_key, ("weight", "w", "edge_weight")),
                ("edge_attr_dict", edge_feature_key, ("feat", "h", "edge_attr")),
            ):  # per-etype edata: every relation's rows (from_hetero checks them)
                if arg in kw or key is None:
                    continue
                present = {k for c in etypes for k in g.edges[c].data.keys()}  # noqa: SIM118
                if key == "auto":
                    key = next((k for k in auto if k in present), None)
                    if key is None:
                        continue
                elif key not in present:
                    raise ValueError(
                        f"no edge type has edata {key!r} (edata keys: {sorted(present)})"
                    )
                kw[arg] = {
                    c: g.edges[c].data[key].detach().cpu() for c in etypes if key in g.edges[c].data
                }
            return cls.from_hetero(
                {t: v.detach().cpu() for t, v in feats.items()},
                {c: torch.stack([s.long(), d.long()]).cpu() for c in etypes
                 for s, d in [g.edges(etype=c)]},
                labels_dict={t: v.cpu() for t, v in labels.items()} or None,
                num_nodes_dict={t: g.num_nodes(t) for t in ntypes},
                node_types=ntypes,
                **kw,
            )  # fmt: skip
        keys = list(g.ndata.keys())
        if feature_key is None:
            feature_key = next((k for k in ("feat", "x") if k in keys), None)
            if feature_key is None:
                raise ValueError(
                    f"the DGL graph has no node features under 'feat' or 'x' (ndata keys: "
                    f"{keys}); pass feature_key="
                )
        elif feature_key not in keys:
            raise ValueError(f"ndata has no key {feature_key!r} (ndata keys: {keys})")
        x = g.ndata[feature_key]
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"ndata[{feature_key!r}] must be a [N, F] tensor, got {shape}")
        if "labels" not in kw and label_key is not None and label_key in keys:
            y = g.ndata[label_key]
            if not y.is_floating_point() and y.numel() == g.num_nodes():
                kw["labels"] = y.reshape(-1)
            else:
                log.warning(
                    "ignoring ndata[%r] of shape %s (not integer labels [N])",
                    label_key,
                    tuple(y.shape),
                )
        ekeys = list(g.edata.keys())
        for arg, key, auto in (
            ("edge_weight", edge_weight_key, ("weight", "w", "edge_weight")),
            ("edge_attr", edge_feature_key, ("feat", "h", "edge_attr")),
            ("edge_type", edge_type_key, ("etype", "rel_type", "edge_type", "_TYPE")),
        ):
            if arg in kw or key is None:
                continue
            if key == "auto":
                key = next((k for k in auto if k in ekeys), None)
                if key is None:
                    continue
            elif key not in ekeys:
                raise ValueError(f"edata has no key {key!r} (edata keys: {ekeys})")
            kw[arg] = g.edata[key].detach().cpu()
        src, dst = g.edges()
        edge_index = torch.stack([src.long(), dst.long()]).cpu()
        return cls.from_edge_index(edge_index, x.detach().cpu(), **kw)

    def save(self, path: str | Path, *, overwrite: bool = False, progress: bool = True) -> None:
        """Write this store to a graph-store directory atomically (same version id).

        Raises:
            FileExistsError: ``path`` exists, is not empty and ``overwrite`` is false.
        """
        contents = StoreContents(
            indptr=self.indptr.numpy(),
            indices=self.indices.numpy(),
            features=ArrayFeatures(self.features.detach().cpu().numpy()),
            feature_perm=None,
            node_ids=None if self.node_ids is None else self.node_ids.numpy(),
            labels=None if self.labels is None else self.labels.numpy(),
            ordering=self.ordering,
            flags=self.meta.flags,
            edge_weight=None if self.edge_weight is None else self.edge_weight.numpy(),
            edge_features=None if self.edge_features is None else self.edge_features.numpy(),
            edge_type=None if self.edge_type is None else self.edge_type.numpy(),
            relations=self.relations,
            node_types=self.node_types,
            type_node_ids=self.topology.type_node_ids,
        )
        meta = write_contents(path, contents, overwrite=overwrite, progress=progress)
        if meta.version != self.version:  # pragma: no cover - would be a hashing bug
            log.warning("saved version %s differs from %s", meta.version, self.version)

    def edge_index(self) -> torch.Tensor:
        """``[2, E]`` int64 edges in storage ids (row 0 source, row 1 destination), CSC order.

        Feed it with :attr:`features` to the model's own forward for a full-graph reference
        in storage order; map rows back with :meth:`to_external`.
        """
        return torch.from_numpy(self.topology.edge_index())

    # ------------------------------------------------------------------ degrees
    @cached_property
    def in_degrees(self) -> torch.Tensor:
        """int64 ``[N]``: number of in-edges of each storage node."""
        return torch.from_numpy(self.topology.in_degrees)

    @cached_property
    def out_degrees(self) -> torch.Tensor:
        """int64 ``[N]``: number of out-edges (occurrences as a source) of each node."""
        return torch.from_numpy(self.topology.out_degrees)

    @property
    def relation_csc(self) -> RelationCSC | None:
        """Each relation's in-edges as a CSC of its own (:mod:`.relation_csc`), built on
        first use (once: concurrent first uses wait for one build); ``None`` without typed
        edges, and for a store made for one request (:attr:`per_request`: a live graph's
        request delta), which would build it for one full layer and drop it."""
        topo = self.topology
        if topo.edge_type is None or not self.relations or self.per_request:
            return None
        with self._relation_csc_lock:
            if self._relation_csc is None:
                types = self.node_types
                self._relation_csc = RelationCSC.build(
                    topo.indptr,
                    topo.indices,
                    topo.edge_type,
                    len(self.relations),
                    (lambda ids: type_of(types, ids)) if types else None,
                )
        return self._relation_csc

    @property
    def avg_degree(self) -> float:
        """Average in-degree ``E / N`` (0 for an empty graph)."""
        return self.topology.avg_degree

    @property
    def num_classes(self) -> int | None:
        """Number of label classes (``None`` without labels)."""
        return self.meta.num_classes

    # ------------------------------------------------------------------ IDs
    def to_storage(self, ids: Any) -> torch.Tensor:
        """External IDs (int, sequence, array or tensor) -> int64 storage indices, same shape.

        Raises:
            UnknownNodeError: some IDs are not in the graph (``.unknown`` lists them).
            TypeError: non-integer input.
        """
        return torch.from_numpy(self.topology.to_storage(ids))

    def to_external(self, storage_idx: Any) -> torch.Tensor:
        """Storage indices -> int64 external IDs, same shape.

        Raises:
            IndexError: an index is outside ``0..N-1``.
        """
        return torch.from_numpy(self.topology.to_external(storage_idx))

    def sorted_external_order(self) -> torch.Tensor:
        """Storage indices ordered by ascending external ID (cached; ``arange`` for identity)."""
        return torch.from_numpy(self.topology.sorted_external_order)

    @property
    def relations(self) -> list[str] | None:
        """Relation names by id (the values of :attr:`edge_type`), or ``None``."""
        return self.topology.relations

    @property
    def node_types(self) -> list[Any] | None:
        """Typed node sets (:class:`~.node_types.NodeTypeInfo`, id order), or ``None``."""
        return self.topology.node_types

    @cached_property
    def node_type_ids(self) -> torch.Tensor | None:
        """int64 ``[N]``: each storage node's type (its index in :attr:`node_types`), or
        ``None`` for an untyped store; a model's ``node_type`` / ``ntype`` argument."""
        types = self.node_types
        if not types:
            return None
        return torch.from_numpy(type_of(types, np.arange(self.num_nodes)))

    @classmethod
    def from_hetero(cls, x_dict: Any, edge_index_dict: Any, **kw: Any) -> GraphStore:
        """A typed store from per-type features and per-relation edge indices; see
        :func:`~.node_types.from_hetero`."""
        from hopserve.worker.graph.node_types import from_hetero

        return from_hetero(x_dict, edge_index_dict, **kw)

    def _edge_repr(self) -> str:
        parts = []
        if self.edge_weight is not None:
            parts.append("edge_weight, ")
        if self.edge_features is not None:
            parts.append(f"edge_dim={self.edge_features.shape[1]}, ")
        if self.node_types is not None:
            parts.append(f"node_types={len(self.node_types)}, ")
        if self.relations is not None:
            parts.append(f"relations={len(self.relations)}, ")
        return "".join(parts)

    def __repr__(self) -> str:
        where = f", path='{self.path}'" if self.path else ""
        return (
            f"GraphStore(nodes={self.num_nodes:,}, edges={self.num_edges:,}, "
            f"dim={self.feature_dim}, dtype={self.meta.feature_dtype}, "
            f"{self._edge_repr()}"
            f"ordering={self.ordering}, version={self.version[:12]}{where})"
        )
