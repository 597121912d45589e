"""The batch a conv runs on, and the adapter interface.

A :class:`LayerBatch` is one batch of one layer: ``num_dst`` destination nodes and every in-neighbour
they have (or the sampled ones). Source rows are ordered **destination-first**: rows
``0 .. num_dst-1`` of the source side are the destination nodes themselves, in the same
order, so ``x_src[:num_dst]`` is the destination side and a self-loop ``(i, i)`` in local
indices is the node's own loop.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

# Blocks build valid CSR by construction; torch's one-time beta notice is noise here.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


class UnsupportedConvError(ValueError):
    """A conv (or model) the engine cannot run exactly layer by layer.

    Args:
        message: the full message (names the conv and what to do instead).
        reason: the short reason alone, as the support matrix states it (default: the
            message).
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message


@dataclass(frozen=True)
class Sampling:
    """Which sampled graph a batch's edges come from: :math:`G_l` of ``layer``.

    :math:`G_l` is the graph in which every node keeps its ``<= fanout`` sampled in-edges
    at ``layer`` under ``seed`` (:func:`hopserve.worker.graph.planner.sample_in_edges`). A
    batch's destinations hold exactly their :math:`G_l` in-edges; adapters whose conv
    reads degree statistics must take them from :math:`G_l`, not from the whole graph
    (which is :math:`G_l` only when ``fanout`` is at least the maximum in-degree).
    """

    layer: int
    fanout: int  # >= 0 (fanout -1 = all in-edges is an exact batch: no Sampling)
    seed: int


@dataclass
class LayerBatch:
    """One batch of one layer, in local indices.

    Attributes:
        src_nodes: storage ids of the source rows, int64 ``[n_src]``; the first
            ``num_dst`` are the destination nodes.
        num_dst: number of destination nodes ``B``.
        indptr: local CSC over destinations, int64 ``[B + 1]``: the in-edges of
            destination ``i`` are positions ``indptr[i]:indptr[i+1]``.
        src_index: local source position of each in-edge, int64 ``[E]``.
        edge_ids: position of each in-edge in the graph store's CSC ``indices`` (int64
            ``[E]``), for adapters that look up per-edge global statistics.
        layer: the layer index this batch belongs to (1-based).
        global_src_size: set (to the graph's node count) when source rows are the whole
            stored node table, indexed by storage id: ``src_index`` then holds storage ids,
            ``src_nodes`` only the destinations, and nothing is gathered.
        dst_start: first storage id of a contiguous destination run (global mode), so
            destination rows are a view of the node table.
        sampling: for sampling evaluation with a fanout ``>= 0``, the sampled graph
            :math:`G_l` the edges belong to; ``None`` for exact batches (every in-edge).
        graph: the graph store a contiguous destination run of a full layer was cut from
            (global mode, ``dst_start`` set, on the host), whose per-graph indexes adapters
            may read (:attr:`~hopserve.worker.graph.store.GraphStore.relation_csc`); else
            ``None``.
    """

    src_nodes: Tensor
    num_dst: int
    indptr: Tensor
    src_index: Tensor
    edge_ids: Tensor
    layer: int
    global_src_size: int | None = None
    dst_start: int | None = None
    sampling: Sampling | None = None
    graph: Any = field(default=None, repr=False)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_src(self) -> int:
        if self.global_src_size is not None:
            return self.global_src_size
        return int(self.src_nodes.numel())

    def dst_rows(self, t: Tensor) -> Tensor:
        """Destination rows of a source-row tensor (a view where possible)."""
        if self.global_src_size is None:
            return t[: self.num_dst]
        if self.dst_start is not None:
            return t[self.dst_start : self.dst_start + self.num_dst]
        return t.index_select(0, self.dst_nodes.to(t.device))

    @property
    def num_edges(self) -> int:
        return int(self.src_index.numel())

    @property
    def dst_nodes(self) -> Tensor:
        return self.src_nodes[: self.num_dst]

    @property
    def dst_index(self) -> Tensor:
        """Local destination of each in-edge (``[E]``), expanded from :attr:`indptr`."""
        if "dst_index" not in self._cache:
            counts = self.indptr[1:] - self.indptr[:-1]
            self._cache["dst_index"] = torch.repeat_interleave(
                torch.arange(self.num_dst, device=counts.device), counts
            )
        return self._cache["dst_index"]

    @property
    def edge_index(self) -> Tensor:
        """PyG ``edge_index`` ``[2, E]`` (row 0 = local source, row 1 = local destination)."""
        if "edge_index" not in self._cache:
            self._cache["edge_index"] = torch.stack([self.src_index, self.dst_index])
        return self._cache["edge_index"]

    def adj_t(self, values: Tensor | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
        """Transposed adjacency ``[B, n_src]`` as torch sparse CSR (PyG's fused SpMM path)."""
        if values is None:
            key = f"ones:{dtype}"
            if key not in self._cache:
                self._cache[key] = torch.ones(
                    self.num_edges, dtype=dtype, device=self.src_index.device
                )
            values = self._cache[key]
        return torch.sparse_csr_tensor(
            self.indptr,
            self.src_index,
            values,
            size=(self.num_dst, self.num_src),
            check_invariants=False,
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> LayerBatch:
        """Move the index tensors to ``device`` (without :attr:`graph`: its per-graph
        indexes are host tensors)."""
        return LayerBatch(
            src_nodes=self.src_nodes.to(device, non_blocking=non_blocking),
            num_dst=self.num_dst,
            indptr=self.indptr.to(device, non_blocking=non_blocking),
            src_index=self.src_index.to(device, non_blocking=non_blocking),
            edge_ids=self.edge_ids.to(device, non_blocking=non_blocking),
            layer=self.layer,
            global_src_size=self.global_src_size,
            dst_start=self.dst_start,
            sampling=self.sampling,
        )

    def with_layer(self, layer: int) -> LayerBatch:
        """The same batch for another layer (sharing its caches: a full layer's one-batch
        block serves every full layer of a run)."""
        return replace(self, layer=layer)

    def csc(self) -> tuple[Tensor, Tensor]:
        """``(indptr, src_index)`` in the narrowest index type at hand, for kernels that
        take either (DGL blocks, torch CSR SpMM, indexing): int64 here."""
        return self.indptr, self.src_index


INT32_MAX = 2**31 - 1
"""A store slice of at most this many edges keeps int32 offsets (and local edge ids)."""


class StoreSliceBatch(LayerBatch):
    """Rows ``start:end`` of a full layer with global sources, read in place from the store.

    The batch's in-edges are the store CSC's positions ``a:b`` (``a = indptr[start]``),
    so its sources are the store's own ``indices[a:b]`` and its edge ids ``a … b-1``. This
    batch keeps the store's slice as it is (:attr:`store_indices`: a view, the store's
    index dtype, int32) and makes the int64 :attr:`src_index` and :attr:`edge_ids` of the
    :class:`LayerBatch` contract on first read only: an adapter that reads the slice in
    place (DGL's int32 blocks, :func:`~hopserve.worker.convs.dgl_conv.dgl_block`) copies
    no index and makes no arange per batch.
    """

    def __init__(self, graph: Any, start: int, end: int, layer: int) -> None:
        a, b = int(graph.indptr[start]), int(graph.indptr[end])
        self.store_indices = graph.indices[a:b]
        self.edge_start = a
        self._src_index: Tensor | None = None
        self._edge_ids: Tensor | None = None
        super().__init__(
            torch.arange(start, end),
            end - start,
            graph.indptr[start : end + 1] - a,
            None,  # made on first read
            None,
            layer,
            global_src_size=graph.num_nodes,
            dst_start=start,
            graph=graph,
        )

    @property
    def src_index(self) -> Tensor:  # type: ignore[override]
        """Storage id of each in-edge's source (int64, made from the slice on first read,
        shared with the batch's twins for other layers)."""
        if self._src_index is None:
            self._src_index = self._shared("src_index", self.store_indices.long)
        return self._src_index

    @src_index.setter
    def src_index(self, value: Tensor | None) -> None:
        self._src_index = value

    @property
    def edge_ids(self) -> Tensor:  # type: ignore[override]
        """Store CSC position of each in-edge (int64 ``a … b-1``, made on first read)."""
        if self._edge_ids is None:
            a = self.edge_start
            self._edge_ids = self._shared("edge_ids", lambda: torch.arange(a, a + self.num_edges))
        return self._edge_ids

    @edge_ids.setter
    def edge_ids(self, value: Tensor | None) -> None:
        self._edge_ids = value

    @property
    def num_edges(self) -> int:
        return int(self.store_indices.numel())

    def csc(self) -> tuple[Tensor, Tensor]:
        """The store's slice as it is (int32 sources and offsets while the batch's edges
        fit an int32; int64 otherwise)."""
        indices = self.store_indices
        if indices.dtype != torch.int32 or self.num_edges > INT32_MAX:
            return self.indptr, self.src_index
        csc = self._cache.get("csc32")
        if csc is None:
            csc = self._cache["csc32"] = (self.indptr.to(torch.int32), indices)
        return csc

    def _shared(self, key: str, make) -> Tensor:  # noqa: ANN001 - () -> Tensor
        """``make()`` once for the batch and its twins (they share ``_cache``)."""
        made = self._cache.get(key)
        if made is None:
            made = self._cache[key] = make()
        return made

    def with_layer(self, layer: int) -> LayerBatch:
        """The batch for another layer: it shares the slice, the caches and the int64
        indexes, made before or after. (``dataclasses.replace`` cannot build this class:
        its ``__init__`` takes the store slice, not the fields.)"""
        twin = copy.copy(self)
        twin.layer = layer
        return twin


@dataclass(frozen=True)
class EdgeInput:
    """One edge data argument of a conv call, served from a graph-store column."""

    param: str  # the conv forward's parameter (e.g. ``edge_weight``, ``edge_attr``)
    arg: str  # the model forward's argument passed to it
    column: str  # ``"weight"`` (``GraphStore.edge_weight``), ``"features"`` or ``"type"``


NODE_COLUMNS = frozenset({"node_type"})
"""Graph data columns with a row per node (a typed store's node type ids), not per edge:
a conv gets its batch's source rows' values."""

DEVICE_COLUMN_MAX_BYTES = 1 << 30
"""Edge columns up to this size are copied to an accelerator once per graph."""


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def served_edge_values(column: str, values: Tensor) -> Tensor:
    """A column's rows as a conv takes them: relation ids (int16 in the store) and node
    type ids as int64, which typed convs index their per-type weights with."""
    return values.long() if column in ("type", "node_type") else values


class ConvAdapter(nn.Module):
    """Runs one conv module on a :class:`LayerBatch` and returns destination rows only.

    Subclasses implement :meth:`run`. ``prepare(graph)`` computes any whole-graph
    statistic once per graph (e.g. GCN's source degrees) before the first batch.
    The adapter holds the user's conv as a submodule, so weights are shared, not copied.

    Edge data: adapters with :attr:`accepts_edge_data` take the edge data arguments of
    their conv's calls (:meth:`set_edge_inputs`, from the split); :meth:`bind_edge_data`
    (called by ``prepare``) takes the graph's columns, or refuses a graph that lacks a
    column the model's ``forward`` takes, and :meth:`edge_values` gathers the rows of a
    batch's edges (``batch.edge_ids`` are positions in the store's CSC, which is the
    columns' order).
    """

    accepts_edge_data = False
    node_inputs: dict[str, str] = {}
    """Extra per-node inputs the conv's calls take besides ``x`` (``{param: rows}``): the
    split passes each to :meth:`run` by name, holding ``"src"`` rows (destination-first, as
    ``x``) or ``"dst"`` rows only. A call with any other tensor argument is refused."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv
        self._lock = threading.Lock()
        self.edge_inputs: tuple[EdgeInput, ...] = ()
        self.model_edge_args: dict[str, str] = {}  # the model's edge data args -> column
        self.model_name = "model"
        self.edge_feature_dim: int | None = None  # width the conv expects (features)
        self.num_relations: int | None = None  # relations the typed-edge convs have weights for
        self.num_node_types: int | None = None  # node types the convs taking type ids know
        self._edge_key: object | None = None
        self._edge_columns: dict[str, Tensor] = {}
        self._edge_on_device: dict[tuple[str, str], Tensor] = {}
        self._edge_lock = threading.Lock()

    def set_edge_inputs(
        self,
        inputs: tuple[EdgeInput, ...],
        model_edge_args: dict[str, str],
        model_name: str,
        edge_feature_dim: int | None = None,
    ) -> None:
        """What edge data the conv is called with, and what the whole model takes."""
        self.edge_inputs = tuple(inputs)
        self.model_edge_args = dict(model_edge_args)
        self.model_name = model_name
        self.edge_feature_dim = edge_feature_dim

    def bind_edge_data(self, graph: Any) -> None:
        """Take ``graph``'s edge columns (once per graph).

        Raises:
            ModelTraceError: the graph lacks a column an edge data argument of the model
                needs (naming the argument), or its edge features have another width.
        """
        if not self.model_edge_args:
            return
        key = (id(graph), getattr(graph, "version", None))
        if key == self._edge_key:
            return
        from hopserve.worker.trace.tracer import (
            EDGE_COLUMNS,
            ModelTraceError,
            missing_edge_data_message,
        )

        columns: dict[str, Tensor] = {}
        for arg, column in self.model_edge_args.items():
            value = getattr(graph, EDGE_COLUMNS[column], None)
            if value is None:
                raise ModelTraceError(missing_edge_data_message(self.model_name, arg, column))
            columns[column] = value
        feats = columns.get("features")
        want = self.edge_feature_dim
        if feats is not None and want is not None and int(feats.shape[1]) != want:
            raise ModelTraceError(
                f"the graph's edge features are {int(feats.shape[1])} wide, but "
                f"{self.model_name}'s conv ({type(self.conv).__name__}) expects {want} "
                "(check the model's edge_dim, or the graph the config names)"
            )
        node_types = getattr(graph, "node_types", None) or []
        want = self.num_node_types
        if "node_type" in columns and want is not None and len(node_types) > want:
            names = [t.name for t in node_types]
            raise ModelTraceError(
                f"the graph has {len(names)} node types ({', '.join(names[:8])}"
                f"{', ...' if len(names) > 8 else ''}), but {self.model_name}'s conv "
                f"({type(self.conv).__name__}) has weights for {want} (check the model's "
                "number of node types, or the graph the config names)"
            )
        relations = getattr(graph, "relations", None) or []
        want = self.num_relations
        if "type" in columns and want is not None and len(relations) > want:
            raise ModelTraceError(
                f"the graph has {len(relations)} relations ({', '.join(relations[:8])}"
                f"{', ...' if len(relations) > 8 else ''}), but {self.model_name}'s conv "
                f"({type(self.conv).__name__}) has weights for {want} (check the "
                "model's num_relations, or the graph the config names)"
            )
        with self._edge_lock:
            self._edge_columns = columns
            self._edge_on_device = {}
            self._edge_key = key

    def edge_values(self, batch: LayerBatch) -> dict[str, Tensor]:
        """``{conv parameter: rows of the batch's edges}`` (on the batch's device); a node
        column (node type ids) gives the rows of the batch's source nodes.

        On an accelerator the column is copied there once per graph when it is small
        (at most :data:`DEVICE_COLUMN_MAX_BYTES`); a larger one stays on the host and
        each batch's rows are gathered there and copied over.
        """
        out = {}
        for inp in self.edge_inputs:
            host = self._edge_columns[inp.column]
            # Node columns: the batch's source rows (destinations first), or every node
            # when the source rows are the whole stored table.
            if inp.column in NODE_COLUMNS:
                ids = batch.src_nodes if batch.global_src_size is None else None
            else:
                ids = batch.edge_ids
            if ids is None:
                out[inp.param] = served_edge_values(
                    inp.column, self._edge_column(inp.column, batch.src_index.device)
                )
                continue
            if ids.device.type != "cpu" and _nbytes(host) > DEVICE_COLUMN_MAX_BYTES:
                rows = host[ids.cpu()].to(ids.device, non_blocking=True)
            else:
                rows = self._edge_column(inp.column, ids.device)[ids]
            out[inp.param] = served_edge_values(inp.column, rows)
        return out

    def _edge_column(self, column: str, device: torch.device) -> Tensor:
        host = self._edge_columns[column]
        if device.type == "cpu":
            return host
        key = (column, str(device))
        with self._edge_lock:
            cached = self._edge_on_device.get(key)
            if cached is None:
                cached = self._edge_on_device[key] = host.to(device)
        return cached

    def prepare(self, graph: Any) -> None:
        """Compute whole-graph statistics once per graph (default: the edge columns)."""
        self.bind_edge_data(graph)

    @property
    def supports_global_src(self) -> bool:
        """Whether :meth:`run` accepts the whole node table as source rows (no gather)."""
        return False

    @property
    def global_src_full_layers_only(self) -> bool:
        """Whether :attr:`supports_global_src` holds for full layers only (every node a
        destination): the adapter derives a whole-table tensor once per layer, which a
        partial frontier must not pay for."""
        return False

    @property
    def full_layer_table_only(self) -> bool:
        """Whether on a full layer this adapter can derive its source table before the
        first batch (:meth:`derive_full_layer_table`) and its batches then read nothing of
        the input itself, so the engine may free an input no later block reads."""
        return False

    def derive_full_layer_table(self, x: Tensor, stand_in: Tensor, layer: int) -> None:
        """Derive full layer ``layer``'s source table from ``x`` now, for batches that are
        given ``stand_in`` (:func:`~hopserve.worker.convs.layer_table.stand_in`) instead of a
        freed ``x``, or ``x`` itself when it stays (the graph's features)."""
        raise NotImplementedError(type(self).__name__)

    def drop_full_layer_table(self) -> None:
        """Drop the table of :meth:`derive_full_layer_table` (the engine, after the layer)."""

    def edge_bytes(self, src_row_bytes: int) -> int:
        """Bytes per in-edge this conv allocates on a batch (CPU memory accounting).

        Default: one message row per edge (gather-scatter message passing).
        """
        return src_row_bytes

    def src_bytes(self, src_row_bytes: int) -> int:
        """Bytes per gathered source row this conv allocates on a batch beyond the row
        itself (CPU memory accounting): a per-source projection, say. Default: none."""
        return 0

    def forward(self, x: Tensor, batch: LayerBatch, **node_inputs: Tensor) -> Tensor:
        return self.run(x, batch, **node_inputs)

    def run(self, x: Tensor, batch: LayerBatch, **node_inputs: Tensor) -> Tensor:
        """Return the conv's output for the ``batch.num_dst`` destination rows.

        Args:
            x: source-side input ``[n_src, ...]`` (destination-first rows).
            batch: the batch's local structure.
            node_inputs: the extra per-node inputs of :attr:`node_inputs`, on their rows.
        """
        raise NotImplementedError


_CACHE_ATTRS = ("_cached_edge_index", "_cached_adj_t", "_cached_x")


@contextlib.contextmanager
def fresh_conv_caches(model: nn.Module) -> Iterator[None]:
    """Run ``model`` on another graph without its convs' cached normalizations.

    ``cached=True`` convs (GCN, SGC, …) keep the normalization of the first graph they
    saw; a forward on a probe graph must not reuse (or overwrite) it. The engine itself
    never relies on these caches: adapters compute whole-graph statistics per graph.
    """
    saved = []
    for module in model.modules():
        for attr in _CACHE_ATTRS:
            if getattr(module, attr, None) is not None:
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, None)
    try:
        yield
    finally:
        for module in model.modules():
            for attr in _CACHE_ATTRS:
                if hasattr(module, attr):
                    setattr(module, attr, None)
        for module, attr, value in saved:
            setattr(module, attr, value)
