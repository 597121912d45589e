"""DGL ``GraphConv`` on a batch, with whole-graph source out-degree normalization.

.. math::
    h_v' = \\sigma\\Big(b + c^{in}_v \\sum_{u \\in N_{in}(v)} (c^{out}_u\\, h_u) W\\Big),
    \\qquad c^{out}_u = \\max(1, d^{out}_u)^{-p},\\ c^{in}_v = \\max(1, d^{in}_v)^{-q}

with ``norm="both"``: :math:`p = q = 1/2`; ``"left"``: :math:`p = 1`, no :math:`c^{in}`;
``"right"``: no :math:`c^{out}`, :math:`q = 1`; ``"none"``: neither.

Exactness: :math:`d^{out}_u` is the source's out-degree in the *whole* graph; on a batch
DGL would count only the batch's edges out of ``u``. For ``"both"`` / ``"left"``,
``prepare`` computes :math:`c^{out}` once per graph (float32, ``clamp(min=1)``, as DGL does)
and each batch runs the steps of DGL's ``GraphConv.forward`` in its order, with
:math:`c^{out}` taken from the whole graph: source rows times :math:`c^{out}`, ``W``
first when ``in > out`` (on a full layer only, see below), DGL's ``copy_u``/``sum``
kernel, ``W`` after when not applied before, times :math:`c^{in}`, the conv's bias and
activation (its parameters, read at call time; the module is never mutated).
:math:`d^{in}_v` is the batch's in-degree, which is the whole graph's for exact
evaluation (every in-edge of a destination is in its batch) and the sampled count for
sampling evaluation. ``"right"`` / ``"none"`` need no whole-graph statistic and run
unchanged (:class:`~.dgl_conv.DGLConvAdapter`). Edge weights (the model's ``edge_weight``,
from the store's column): DGL multiplies each message by its edge's weight (``u_mul_e``)
and keeps the unweighted degree norms; each case does the same with the weights of the
batch's edges (``u_mul_e_sum``, or times the per-edge norm).

Three cases, by how the batch reads its sources:

* gathered source rows: ``x_src · c_out[src]`` per batch, aggregated first (the ``B``
  destination rows are projected, see :func:`~.dgl_conv.aggregate_first`);
* a full layer read in place (all nodes, storage order; full evaluation): the full-graph
  forward's own source side is computed once per layer
  (:class:`~.dgl_conv.LayerTableCache`) and each batch aggregates it with DGL's
  ``copy_u`` kernel: ``(c_out ⊙ x) W`` when ``in > out`` (made a block of rows at a time,
  no ``[N, in]`` scaled copy); ``c_out ⊙ x`` otherwise, when the engine derives it up
  front — in place of an input it then frees, or beside the graph's features — so the
  layer never holds more than two layer-sized tensors beside the features. An input later
  layers keep (JKNet) is read in place instead, ``c_out[u]`` each edge's factor (a torch
  CSR SpMM, about twice the time of ``copy_u``, no ``[N, in]`` copy), unless the layer is
  one batch: the graph fits the memory budget, and the layer runs as DGL's whole-graph
  forward does, table and all;
* a partial frontier read in place: no whole-table work for a few rows; the conv runs
  through a view with ``norm="none"`` and the per-edge weight :math:`c^{out}_u c^{in}_v`
  (DGL's ``edge_weight`` path, ``u_mul_e``); only the rounding differs (the two factors
  are multiplied per edge).

Sampling: a sampled batch (``batch.sampling`` set, fanout below the graph's maximum
in-degree) belongs to :math:`G_l`, the graph in which every node keeps its sampled
in-edges at layer :math:`l`, and the model's forward on :math:`G_l` normalizes by
:math:`G_l`'s degrees. :math:`d^{in}_v` is then the batch's (sampled) count as above;
:math:`d^{out}_u` counts the sampled in-edges of *all* nodes that come from ``u``
(:func:`~hopserve.worker.graph.planner.sampled_out_degrees`: only nodes with more than
``f`` in-edges are sampled, so O(N) plus their in-edges, O(E log E) at worst), computed
once per ``(layer, fanout, seed)`` and kept for a few of them (float32 ``[N]`` each). The
whole graph's :math:`d^{out}` would scale a source with many sampled-away out-edges too
little. ``"right"`` / ``"none"`` read only the batch's in-degrees, which are :math:`G_l`'s.

Gather-free: a partial frontier's per-edge weights index the stored node table directly
(no per-batch gather, no scaled copy of the table); a full layer's table is
``N × min(in, out)`` values while that layer runs.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch, Sampling
from hopserve.worker.convs.dgl_conv import (
    DGLConvAdapter,
    LayerTableCache,
    aggregate_first,
    csr_weighted_sum,
    dgl_block,
    full_layer,
)
from hopserve.worker.convs.edge_chunks import edge_chunks
from hopserve.worker.convs.layer_table import is_stand_in, whole_layer
from hopserve.worker.graph.planner import sampled_out_degrees

# Sampled (layer, fanout, seed) source-norm vectors kept per adapter (float32 [N] each).
SAMPLED_CACHE_SIZE = 4
# Scaled input rows per step while a full layer's projected table is made (cache-sized).
TABLE_CHUNK_BYTES = 4 << 20


def _unnormalized(conv: nn.Module) -> nn.Module:
    """``conv`` with ``norm="none"`` (aggregating first): same parameters otherwise."""
    view = aggregate_first(conv)
    view = copy.copy(view) if view is conv else view  # a new __dict__, shared parameters
    view._norm = "none"
    return view


class DGLGraphConvAdapter(DGLConvAdapter):
    """Runs ``dgl.nn.GraphConv`` exactly on a batch using whole-graph out-degrees."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv, pair=False)
        self.norm = conv._norm
        self._src_norm: Tensor | None = None  # [N] c_out per storage node
        self._graph = None  # the prepared GraphStore (for sampled out-degrees)
        self._max_in_degree = 0
        self._sampled_norm: OrderedDict[Sampling, Tensor] = OrderedDict()
        self._sample_lock = threading.Lock()
        self._tables = LayerTableCache()

    @property
    def global_norm(self) -> bool:
        return self.norm in ("both", "left")

    def prepare(self, graph) -> None:  # graph: GraphStore
        key = (id(graph), getattr(graph, "version", None))
        if key == self._graph_key:
            return
        super().prepare(graph)
        if self.global_norm:
            self._src_norm = self._out_norm(graph.out_degrees)
            self._graph = graph
            self._max_in_degree = int(graph.in_degrees.max()) if graph.num_nodes else 0
            with self._sample_lock:
                self._sampled_norm.clear()
        self._graph_key = key

    def _out_norm(self, out_degrees: Tensor) -> Tensor:
        """:math:`c^{out}` from out-degrees (float32, ``clamp(min=1)``, as DGL does)."""
        degs = out_degrees.to(torch.float32).clamp(min=1)
        return degs.pow(-0.5) if self.norm == "both" else 1.0 / degs

    def source_norm(self, batch: LayerBatch) -> Tensor:
        """:math:`c^{out}` per storage node for ``batch``'s graph (whole graph or :math:`G_l`)."""
        s = batch.sampling
        if s is None or s.fanout >= self._max_in_degree:
            return self._src_norm
        with self._sample_lock:
            norm = self._sampled_norm.get(s)
            if norm is not None:
                self._sampled_norm.move_to_end(s)
                return norm
        topo = self._graph.topology
        out = sampled_out_degrees(
            topo.indptr, topo.indices, topo.num_nodes, s.fanout, s.layer, s.seed, topo.out_degrees
        )
        norm = self._out_norm(torch.from_numpy(out))
        with self._sample_lock:
            self._sampled_norm[s] = norm
            while len(self._sampled_norm) > SAMPLED_CACHE_SIZE:
                self._sampled_norm.popitem(last=False)
        return norm

    def edge_weight(self, batch: LayerBatch) -> Tensor:
        """``c_out[u] · c_in[v]`` (``"both"``) or ``c_out[u]`` (``"left"``) per in-edge."""
        device = batch.src_index.device
        norm = self.source_norm(batch).to(device)
        if batch.global_src_size is not None:  # src_index holds storage ids
            w = norm[batch.src_index]
        else:
            w = norm[batch.src_nodes][batch.src_index]
        if self.norm == "both":
            degs = (batch.indptr[1:] - batch.indptr[:-1]).to(torch.float32).clamp(min=1)
            w = w * degs.pow(-0.5)[batch.dst_index]
        return w

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        if not self.global_norm:
            return super().run(x, batch)
        if batch.global_src_size is None:  # gathered source rows
            norm = self.source_norm(batch).to(x.device)[batch.src_nodes]
            return self._aggregate(_scale_rows(x, norm), batch, projected=False)
        if full_layer(batch):
            return self._run_full_layer(x, batch)
        w = self.edge_weight(batch).to(x.dtype)
        user = self._user_weight(batch)
        if user is not None:
            w = w * user.to(x.dtype)
        return _unnormalized(self.conv)(dgl_block(batch), self.features(x, batch), edge_weight=w)

    def _user_weight(self, batch: LayerBatch) -> Tensor | None:
        """The model's ``edge_weight`` rows of the batch's edges, or ``None``."""
        if not self.edge_inputs:
            return None
        return self.edge_values(batch)["edge_weight"]

    def _run_full_layer(self, x: Tensor, batch: LayerBatch) -> Tensor:
        """A full layer aggregates the layer's source table, made once per layer: DGL's
        own source side, ``(c_out ⊙ x) W`` when ``in > out``, else ``c_out ⊙ x`` when the
        engine derived it up front (in place of a freed input, or beside the features) or
        the layer is one batch (the whole-graph forward's own step, memory included);
        otherwise ``x`` is read in place with ``c_out[u]`` as each edge's factor."""
        key = self._table_key(batch.layer, batch.sampling)
        norm = self.source_norm(batch)
        if self._projects_first:
            table = self._tables.get(x, key, batch, lambda: self._make_table(x, norm))
            return self._aggregate(table, batch, projected=True)
        table = self._tables.derived(x, key)
        if table is None and whole_layer(batch):
            table = self._make_table(x, norm)  # the layer in one batch: the forward's own step
        if table is not None:
            return self._aggregate(table, batch, projected=False)
        if is_stand_in(x):
            raise RuntimeError(
                f"layer {batch.layer}: GraphConv's input was freed without its table"
            )
        scale = norm.to(x.device)[batch.csc()[1]]
        return self._aggregate(x, batch, projected=False, edge_scale=scale)

    @property
    def _projects_first(self) -> bool:
        """Whether DGL multiplies ``W`` in before aggregating (``in > out``)."""
        conv = self.conv
        return conv.weight is not None and conv._in_feats > conv._out_feats

    def _table_key(self, layer: int, sampling: Sampling | None) -> tuple:
        weight = self.conv.weight
        return (layer, sampling, (id(weight), getattr(weight, "_version", 0)))

    def _make_table(self, x: Tensor, norm: Tensor) -> Tensor:
        """The source table of every stored row: ``(c_out ⊙ x) W`` (made a block of rows at
        a time: no ``[N, in]`` scaled copy) or ``c_out ⊙ x``."""
        norm = norm.to(x.device)
        if not self._projects_first:
            return _scale_rows(x, norm)
        weight = self.conv.weight
        table = x.new_empty((x.shape[0], weight.shape[1]))
        row_bytes = x[:1].numel() * x.element_size()
        for rows in edge_chunks(x.shape[0], row_bytes, TABLE_CHUNK_BYTES):  # slices of rows
            torch.matmul(_scale_rows(x[rows], norm[rows]), weight, out=table[rows])
        return table

    @property
    def full_layer_table_only(self) -> bool:
        """A full layer reads only its source table (and the degrees), never ``x``."""
        return self.global_norm and self.supports_global_src

    def derive_full_layer_table(self, x: Tensor, stand_in: Tensor, layer: int) -> None:
        table = self._make_table(x, self._src_norm)  # the whole graph's c_out (exact layers)
        self._tables.put(stand_in, self._table_key(layer, None), table)

    def drop_full_layer_table(self) -> None:
        self._tables.clear()

    def _aggregate(
        self, src: Tensor, batch: LayerBatch, *, projected: bool, edge_scale: Tensor | None = None
    ) -> Tensor:
        """DGL ``GraphConv.forward`` from the aggregation on: sum (times ``edge_scale`` and
        the model's edge weights, if any, per edge), ``W`` unless ``projected``, ``c_in``,
        bias, act."""
        import dgl

        conv = self.conv
        block = dgl_block(batch)
        degs = batch.indptr[1:] - batch.indptr[:-1]
        if not conv._allow_zero_in_degree and bool((degs == 0).any()):
            raise dgl.DGLError(
                "There are 0-in-degree nodes in the graph, output for those nodes will be "
                "invalid (GraphConv with allow_zero_in_degree=False)."
            )
        user = self._user_weight(batch)
        if user is not None and edge_scale is not None:
            user = edge_scale * user.to(edge_scale.dtype)
        elif user is None:
            user = edge_scale
        if user is None:
            rst = dgl.ops.copy_u_sum(block, src)
        elif src.dim() == 2:  # DGL's u_mul_e_sum, as a torch CSR SpMM (same sums)
            size = (batch.num_dst, block.num_src_nodes())
            indptr, indices = batch.csc()
            rst = csr_weighted_sum(indptr, indices, user.to(src.dtype), src, size)
        else:  # DGL's u_mul_e with the model's weights; the norms stay unweighted degrees
            e = user.to(src.dtype).reshape((-1,) + (1,) * (src.dim() - 1))
            rst = dgl.ops.u_mul_e_sum(block, src, e)
        if not projected and conv.weight is not None:
            rst = torch.matmul(rst, conv.weight)
        # rst is this call's own tensor: the epilogue runs in place (no layer-sized copies)
        if self.norm == "both":
            norm = degs.to(rst).clamp(min=1).pow(-0.5)
            rst.mul_(norm.reshape(norm.shape + (1,) * (rst.dim() - 1)))
        if conv.bias is not None:
            rst.add_(conv.bias)
        if conv._activation is not None:
            rst = conv._activation(rst)
        return rst


def _scale_rows(x: Tensor, norm: Tensor) -> Tensor:
    """``x`` with row ``u`` times ``norm[u]`` (DGL's ``feat_src * norm``)."""
    return x * norm.to(x.dtype).reshape(norm.shape + (1,) * (x.dim() - 1))
