"""Default adapter for DGL convs (``dgl.nn.pytorch``) that aggregate 1-hop in-neighbours.

.. math::
    h_v' = \\gamma\\big(h_v,\\ \\bigoplus_{u \\in N_{in}(v)} \\phi(h_v, h_u, e_{uv})\\big)

The batch becomes a DGL *block* (``dgl.create_block`` from the batch's local CSC:
destinations are columns, block edge ``i`` is the batch's in-edge ``i``, so edge data
arguments — ``edge_weight``, ``efeat``, ``edge_feat``, ``pseudo`` — are the store
column's rows ``column[batch.edge_ids]``, passed as the conv's own keywords) and the conv
runs as DGL runs it in its own layer-wise inference loops: ``conv(block, x_src)``, where
DGL takes the destination rows as ``x_src[:num_dst]`` — hopserve's batches are
destination-first, as DGL's blocks are.

Exactness: the batch holds every in-edge of each destination (duplicates and self-loops
included), so per-destination reductions (sum / mean / max, edge softmax, the in-degree
of ``SAGEConv(aggregator_type="gcn")``) see exactly what the full graph gives them.
Zero-in-degree checks: a destination has no in-edge in its batch iff it has none in the
graph, so the conv's own ``allow_zero_in_degree`` check fires on a batch exactly when the
full-graph forward would fail; :meth:`DGLConvAdapter.prepare` raises the same refusal for
the whole graph up front, naming the conv. LSTM aggregation (``SAGEConv``) reads messages
in edge-id order (DGL's degree bucketing): on a batch that is ascending source storage id,
which equals the full graph's order when its edge ids list each node's in-edges by
ascending source (see README).

Kernels: the DGL block is a ``DGLBlock`` subclass whose ``update_all`` runs DGL's ``u_mul_e`` →
``sum`` pattern (attention-weighted sums) as one torch CSR SpMM per head — the same sums,
several times faster than DGL 2.1's CPU kernel on large batches; everything else is DGL's.

Aggregate first: linear convs that DGL runs projection-first when ``in > out``
(``GraphConv``, ``SAGEConv`` mean/gcn) run through a view that aggregates first, so each
batch projects its ``B`` destination rows instead of all its source rows
(:func:`aggregate_first`).

Gather-free: convs that then reduce raw source rows (``GINConv``, ``GraphConv``,
``SAGEConv`` mean/gcn) read the stored node table in place: the batch's source side is
the whole table (``num_src_nodes = N``) and the destination rows are passed explicitly as
``(table, table[dst])``.

Full layers: when a gather-free layer's destinations are every node in storage order
(full evaluation), its batches share one source table, and the source-side work DGL's
full-graph forward does once (``SAGEConv`` mean/gcn with ``in > out``: ``fc_neigh`` of
every source row) is done once per layer too (:class:`LayerTableCache`), not once per
batch; each batch then aggregates the projected ``out``-wide rows with DGL's own kernel.
That is the full-graph forward's own order of operations, split by destination rows.
"""

from __future__ import annotations

import copy
import functools
import threading

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch
from hopserve.worker.convs.layer_table import LayerTableCache, csr_weighted_sum, full_layer

# Input-wide rows per edge of convs that keep several per-edge tensors (HGT: gathered
# keys, queries and values, and the relation-mapped keys and messages); default one.
_EDGE_ROWS = {"HGTConv": 6}
# Convs whose update reads per-edge messages only through DGL's fused SpMM kernels.
_FUSED = {"GraphConv", "GINConv"}
_FUSED_SAGE = {"mean", "gcn", "pool"}
# Attention convs that keep per-edge scores only ([E, heads]; messages fused in SpMM).
_EDGE_SCORES = {"GATConv", "DotGatConv", "AGNNConv"}


# Below this many edges DGL's own u_mul_e kernel beats per-head CSR SpMM (fixed costs).
SPMM_MIN_EDGES = 32768


_ARANGE: dict[torch.dtype, Tensor] = {}  # the shared CPU buffers, once made
_ARANGE_LOCK = threading.Lock()
SHARED_EDGE_IDS = 1 << 20
"""Batches of at most this many edges share one arange per index type (8 MiB int64, 4 MiB
int32), made once per process."""


def local_edge_ids(n: int, device: torch.device, dtype: torch.dtype = torch.int64) -> Tensor:
    """``arange(n)`` of ``dtype``: on the CPU and for ``n <= SHARED_EDGE_IDS`` a view of
    one shared buffer (every batch's block stores its local edge ids, and a new ``[E]``
    arange per batch and layer is work a view does not cost); a new arange otherwise, so
    nothing larger outlives its batch. Read-only: DGL keeps it as the block's edge ids."""
    if device.type != "cpu" or n > SHARED_EDGE_IDS:
        return torch.arange(n, device=device, dtype=dtype)
    shared = _ARANGE.get(dtype)
    if shared is None:
        with _ARANGE_LOCK:
            shared = _ARANGE.setdefault(dtype, torch.arange(SHARED_EDGE_IDS, dtype=dtype))
    return shared[:n]


def dgl_block(batch: LayerBatch):
    """The DGL block of ``batch`` (cached on it, so convs of one layer share it).

    A :class:`~hopserve.worker.convs.base.StoreSliceBatch` becomes an int32 block over the
    store's own index slice (:meth:`~hopserve.worker.convs.base.LayerBatch.csc`; DGL's
    kernels take either index type): no int64 copy of the batch's sources, no arange of
    its edge ids."""
    cached = batch._cache.get("dgl_block")
    if cached is None:
        indptr, indices = batch.csc()
        # Explicit edge ids (CSC positions): DGL's max/min SpMM kernels need them.
        eids = batch._cache.get("local_edge_ids") if indices.dtype == torch.int64 else None
        if eids is None:
            eids = local_edge_ids(batch.num_edges, indices.device, indices.dtype)
        cached = hopserve_block(indptr, indices, eids, batch.num_src, batch.num_dst)
        batch._cache["dgl_block"] = cached
    return cached


def hopserve_block(indptr: Tensor, indices: Tensor, eids: Tensor, num_src: int, num_dst: int):
    """:func:`csc_block` as a block that knows its CSC (``in_degrees()`` from ``indptr``,
    ``u_mul_e`` sums as torch CSR SpMM; see :func:`_spmm_block_class`)."""
    block = csc_block(indptr, indices, eids, num_src, num_dst)
    block.__class__ = _spmm_block_class()
    block._hopserve_csc = (indptr, indices, block._graph)
    return block


def csc_block(indptr: Tensor, indices: Tensor, eids: Tensor, num_src: int, num_dst: int):
    """``dgl.create_block(("csc", (indptr, indices, eids)), num_src, num_dst)`` on the CPU,
    built as ``create_block`` builds it (one relation ``_N → _N`` of a two-type metagraph)
    without its scan of every index for the largest node ID: a batch's source positions
    are below ``num_src`` by construction, and the scan costs as much as a small layer's
    aggregation (``tests/with_dgl/test_dgl_blocks.py`` checks both give the same block).
    On an accelerator: ``dgl.create_block`` itself."""
    if indptr.device.type != "cpu":
        import dgl

        return dgl.create_block(
            ("csc", (indptr, indices, eids)),
            num_src_nodes=num_src,
            num_dst_nodes=num_dst,
            device=indptr.device,
        )
    from dgl import heterograph_index, utils
    from dgl.heterograph import DGLBlock

    formats = ["coo", "csr", "csc"]
    rel = heterograph_index.create_unitgraph_from_csr(
        2, num_src, num_dst, indptr, indices, eids, formats, True
    )
    counts = utils.toindex([num_src, num_dst], "int64")
    index = heterograph_index.create_heterograph_from_relations(_block_metagraph(), [rel], counts)
    return DGLBlock(index, (["_N"], ["_N"]), ["_E"])


@functools.cache
def _block_metagraph():
    """The metagraph of every one-relation block (``_N → _N``): immutable, so made once
    and shared, as DGL shares a graph's metagraph with the graphs derived from it."""
    from dgl import graph_index

    return graph_index.from_coo(2, [0], [1], True)


@functools.cache
def _spmm_block_class() -> type:
    """A ``DGLBlock`` whose ``u_mul_e`` → ``sum`` message passing runs as torch CSR SpMM.

    DGL 2.1's CPU kernel for ``u_mul_e`` (attention-weighted sums: GAT, GATv2, DotGat,
    AGNN, edge weights) is several times slower than its ``copy_u`` kernel; a sparse CSR
    matrix per head whose values are the edge scalars computes the same sums. The conv's
    own code runs unchanged; only this kernel is swapped, and only on hopserve's batches.
    ``in_degrees()`` of every destination reads the batch's CSC indptr.
    """
    from dgl.base import ALL, is_all
    from dgl.heterograph import DGLBlock

    class HopserveBlock(DGLBlock):
        def in_degrees(self, v=ALL, etype=None):
            # Every destination's in-degree is the CSC's indptr difference: no arange of
            # the destinations and no C call per batch (DGL's mean reduce asks each time).
            csc = _own_csc(self)
            if csc is not None and etype is None and is_all(v):
                indptr = csc[0]
                return indptr[1:] - indptr[:-1]
            return super().in_degrees(v, etype)

        def __getitem__(self, key):
            # update_all runs on ``self[etype]``, a new block of the one relation: it keeps
            # the CSC, so the mean reduce's in_degrees() there takes the path above too.
            view = super().__getitem__(key)
            csc = _own_csc(self)
            if csc is not None and type(view) is type(self) and len(self.canonical_etypes) == 1:
                view._hopserve_csc = (csc[0], csc[1], view._graph)
            return view

        def update_all(self, message_func, reduce_func, apply_node_func=None, etype=None):
            out = None
            if apply_node_func is None and etype is None:
                out = _u_mul_e_sum(self, message_func, reduce_func)
            if out is None:
                return super().update_all(message_func, reduce_func, apply_node_func, etype)
            self.dstdata[reduce_func.out_field] = out
            return None

    return HopserveBlock


def _own_csc(graph) -> tuple[Tensor, Tensor] | None:
    """The batch's ``(indptr, indices)`` when ``graph`` still is the block made of them;
    ``None`` for a copy DGL made with another index (``.int()``, ``.to(device)``)."""
    csc = getattr(graph, "_hopserve_csc", None)
    if csc is None or graph._graph is not csc[2]:
        return None
    return csc[0], csc[1]


def _u_mul_e_sum(graph, mfunc, rfunc) -> Tensor | None:
    """``sum_{e=(u,v)} x_u * w_e`` per destination, or ``None`` when not that pattern."""
    if (
        getattr(mfunc, "binary_op", None) != "mul"
        or (getattr(mfunc, "lhs", None), getattr(mfunc, "rhs", None)) != (0, 2)  # u, e
        or getattr(rfunc, "_name", None) != "sum"
        or getattr(rfunc, "msg_field", None) != mfunc.out_field
        or graph.num_edges() < SPMM_MIN_EDGES
    ):
        return None
    x, w = graph.srcdata[mfunc.lhs_field], graph.edata[mfunc.rhs_field]
    if x.dtype != w.dtype or not x.is_floating_point() or x.device != w.device:
        return None
    csc = _own_csc(graph)
    if csc is None:
        return None
    indptr, indices = csc
    size = (graph.num_dst_nodes(), graph.num_src_nodes())

    def spmm(values: Tensor, dense: Tensor) -> Tensor:
        return csr_weighted_sum(indptr, indices, values, dense, size)

    e = graph.num_edges()
    if x.dim() == 2 and tuple(w.shape) in ((e,), (e, 1)):
        return spmm(w.reshape(-1).contiguous(), x)
    if x.dim() == 3 and tuple(w.shape) == (e, x.shape[1], 1):  # heads: [E, H, 1] x [N, H, D]
        heads = [spmm(w[:, h, 0].contiguous(), x[:, h].contiguous()) for h in range(x.shape[1])]
        return torch.stack(heads, dim=1)
    return None


class _Precomputed(nn.Module):
    """Stands in for a linear layer whose outputs on some inputs are already known."""

    def __init__(self, linear: nn.Module, known: list[tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        self.linear = linear
        self.known = known  # (input, its output)

    def forward(self, inp: Tensor) -> Tensor:
        for src, out in self.known:
            if (
                inp.data_ptr() == src.data_ptr()
                and inp.shape == src.shape
                and inp.stride() == src.stride()
            ):
                return out
        return self.linear(inp)


def _params_key(*params: Tensor | None) -> tuple:
    """Identity and in-place version of parameters (a weight update invalidates a table)."""
    return tuple((id(p), p._version) if p is not None else None for p in params)


def _class_names(conv: nn.Module) -> set[str]:
    return {c.__name__ for c in type(conv).__mro__ if c.__module__.startswith("dgl.nn.")}


def aggregates_raw_sources(conv: nn.Module) -> bool:
    """Whether ``conv`` (as the adapter runs it) reduces untransformed source rows."""
    names = _class_names(conv)
    if names & {"GINConv", "GraphConv"}:
        return True
    return "SAGEConv" in names and conv._aggre_type in ("mean", "gcn")


def aggregate_first(conv: nn.Module) -> nn.Module:
    """``conv``, or a parameter-sharing view of it that aggregates before projecting.

    ``GraphConv`` (``in_feats > out_feats``) and ``SAGEConv`` mean/gcn
    (``in_feats > out_feats``) multiply ``W`` into every source row before aggregating —
    DGL's choice for a full graph, where each source row is projected once. On batches it
    projects every source row of every batch again (several times ``N`` rows per layer);
    ``W`` is linear and bias-free there, so aggregating first and projecting the ``B``
    destination rows computes the same values (up to rounding) with less work, and lets the
    conv read the stored node table without a gather. The view is a shallow copy with
    DGL's dimension test flipped; the user's module is not mutated.
    """
    names = _class_names(conv)
    if "GraphConv" in names and conv._in_feats > conv._out_feats:
        view = copy.copy(conv)  # a new __dict__; parameter and module dicts are shared
        view._in_feats = conv._out_feats
        return view
    if (
        "SAGEConv" in names
        and conv._aggre_type in ("mean", "gcn")
        and conv._in_src_feats > conv._out_feats
    ):
        view = copy.copy(conv)
        view._in_src_feats = conv._out_feats
        return view
    return conv


_ALWAYS_NONZERO = {"EGATConv"}  # raise on zero-in-degree nodes, with no flag to allow them


def refuses_zero_in_degree(module: nn.Module) -> bool:
    """Whether a DGL module raises on nodes without in-edges (``allow_zero_in_degree=False``,
    or a conv that always does, like ``EGATConv``)."""
    if getattr(module, "_allow_zero_in_degree", True) is False:
        return True
    return type(module).__module__.startswith("dgl.nn.") and bool(
        _class_names(module) & _ALWAYS_NONZERO
    )


def check_zero_in_degree(conv: nn.Module, graph, qualname: str = "") -> None:
    """Refuse, as the conv's own forward would, a graph with zero-in-degree nodes.

    Raises:
        ModelTraceError: the conv has ``allow_zero_in_degree=False`` (or always refuses
            them) and some node of ``graph`` (a GraphStore) has no in-edge (a load-time
            refusal, like the others).
    """
    from hopserve.worker.trace.tracer import ModelTraceError

    if not refuses_zero_in_degree(conv):
        return
    zero = (graph.in_degrees == 0).nonzero().squeeze(1)
    if zero.numel() == 0:
        return
    ids = graph.to_external(zero[:5]).tolist()
    name = f"'{qualname}' " if qualname else ""
    flagged = getattr(conv, "_allow_zero_in_degree", True) is False
    why = "has allow_zero_in_degree=False" if flagged else "refuses zero-in-degree nodes"
    raise ModelTraceError(
        f"DGL conv {name}({type(conv).__name__}) {why} and "
        f"{zero.numel()} node(s) of the graph have no in-edge (node IDs {ids}...); the "
        "model's own forward raises DGLError on this graph too. Add self-loops at ingest "
        "(--self-loops / dgl.add_self_loop) or build the conv with "
        "allow_zero_in_degree=True."
    )


class DGLConvAdapter(ConvAdapter):
    """Runs a DGL conv on the DGL block of a batch: ``conv(block, x_src)``.

    Args:
        conv: the user's DGL conv module (weights shared, not copied).
        pair: call ``conv(block, (x_src, x_src[:B]))`` instead of ``conv(block, x_src)``
            (convs with separate source/destination projections then project only the
            destination rows; default: ``GATv2Conv`` without shared weights).
    """

    qualname = ""  # the conv's name in the model (set by the registry), for messages
    accepts_edge_data = True  # edge data reaches the conv as its own keyword arguments

    def __init__(self, conv: nn.Module, *, pair: bool | None = None) -> None:
        super().__init__(conv)
        names = _class_names(conv)
        if pair is None:
            pair = "GATv2Conv" in names and not getattr(conv, "share_weights", True)
        self.pair = pair
        self._graph_key: object | None = None
        self._fused = bool(names & _FUSED) or (
            "SAGEConv" in names and getattr(conv, "_aggre_type", None) in _FUSED_SAGE
        )
        self._edge_scores = int(getattr(conv, "_num_heads", 1)) if names & _EDGE_SCORES else 0
        self._edge_rows = max((_EDGE_ROWS.get(n, 1) for n in names), default=1)
        # SAGEConv mean/gcn that DGL runs projection-first (in > out): on full layers
        # fc_neigh of the whole table is computed once per layer (see the module doc).
        self._project_first = (
            "SAGEConv" in names
            and getattr(conv, "_aggre_type", None) in ("mean", "gcn")
            and conv._in_src_feats > conv._out_feats
        )
        self._tables = LayerTableCache()

    def prepare(self, graph) -> None:  # graph: GraphStore
        self.bind_edge_data(graph)
        key = (id(graph), getattr(graph, "version", None))
        if key == self._graph_key:
            return
        check_zero_in_degree(self.conv, graph, self.qualname)
        self._graph_key = key

    @property
    def supports_global_src(self) -> bool:
        return aggregates_raw_sources(self.conv)

    def edge_bytes(self, src_row_bytes: int) -> int:
        if self._fused:  # DGL's fused SpMM materializes no messages: index + id per edge
            return 16
        if self._edge_scores:  # logits, leaky-relu'd logits, softmax: [E, heads] each
            return 16 + 12 * self._edge_scores
        return self._edge_rows * src_row_bytes

    def features(self, x: Tensor, batch: LayerBatch) -> Tensor | tuple[Tensor, Tensor]:
        """The conv's feature argument: ``x_src`` or ``(x_src, x_dst)``."""
        if batch.global_src_size is not None or self.pair:
            return x, batch.dst_rows(x)
        return x

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        edge = self.edge_values(batch) if self.edge_inputs else {}
        if self._project_first and full_layer(batch) and not edge:
            return self._run_projected(x, batch)
        return aggregate_first(self.conv)(dgl_block(batch), self.features(x, batch), **edge)

    def _run_projected(self, x: Tensor, batch: LayerBatch) -> Tensor:
        """The conv's own forward on a full layer, ``fc_neigh(x)`` computed once per layer.

        Exactness: the conv runs its own projection-first branch (``lin_before_mp``), as on
        the full graph; ``fc_neigh`` returns the layer's table ``fc_neigh(x)`` (and its
        destination rows) instead of recomputing it for every batch.
        """
        conv = self.conv
        fc = conv.fc_neigh
        key = (batch.layer, _params_key(*fc.parameters()))
        table = self._tables.get(x, key, batch, lambda: fc(x))
        x_dst = batch.dst_rows(x)
        view = copy.copy(conv)  # a new __dict__ and module dict; parameters shared
        known = [(x, table), (x_dst, batch.dst_rows(table))]
        view.__dict__["_modules"] = {**conv._modules, "fc_neigh": _Precomputed(fc, known)}
        return view(dgl_block(batch), (x, x_dst))
