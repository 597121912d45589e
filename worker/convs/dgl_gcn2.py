r"""DGL ``GCN2Conv`` on a batch: degree normalization from the whole graph, and the
initial representation :math:`x_0` read on the destination rows.

.. math::
    \tilde h_v = (1-\alpha) \sum_{u \in N_{in}(v)} a_{uv} h_u + \alpha\, x_{0,v},
    \qquad a_{uv} = c_u c_v,\quad c_u = \max(1, d^{in}_u)^{-1/2}

    h_v' = \sigma\big((1-\beta)\,\tilde h_v + \beta\,\tilde h_v W_1 + b\big)

(with ``project_initial_features=False`` the projection is :math:`(\tilde h_v - \alpha
x_{0,v}) W_1 + \alpha x_{0,v} W_2`). DGL normalizes sources by their *in*-degree, as its
forward computes ``graph.in_degrees()`` once for every node. A batch sees only its
destinations' in-edges, so :math:`d^{in}_u` of a source comes from the whole graph
(``prepare``), and so is every destination's (equal to its batch's on an exact batch).

Edge weights (``conv(g, h, x_0, edge_weight=w)``, from the store's weight column): DGL
normalizes them with ``EdgeWeightNorm("both")``,

.. math::
    a_{uv} = \Big(\sum_{v' \in N_{out}(u)} w_{uv'}\Big)^{-1/2}
             \Big(\sum_{u' \in N_{in}(v)} w_{u'v}\Big)^{-1/2} w_{uv}

(no clamp, no epsilon). The source's weighted out-degree is a whole-graph sum a batch does
not hold: ``prepare`` takes it once per graph; the destination's weighted in-degree is its
batch's (every in-edge is there). Non-positive weights make DGL's forward raise; they are
refused at load, naming the edge.

Sampled batches (:math:`G_l`, every node keeping ``min(d, f)`` in-edges) use
:math:`\min(d^{in}_u, f)`, which is what the forward on :math:`G_l` counts; weighted, the
source's weights summed over its out-edges in :math:`G_l`
(:func:`~hopserve.worker.graph.planner.sampled_out_degrees`). :math:`x_0` is a per-node
input (``ConvAdapter.node_inputs``: ``feat_0`` on ``dst`` rows). A subclass overriding
``forward`` is refused (the adapter runs ``GCN2Conv``'s own steps).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch, Sampling, UnsupportedConvError
from hopserve.worker.convs.dgl_conv import DGLConvAdapter
from hopserve.worker.graph.planner import sampled_out_degrees

# Sampled (layer, fanout, seed) weighted out-degree vectors kept per adapter ([N] each).
SAMPLED_CACHE_SIZE = 4


class DGLGCN2Adapter(DGLConvAdapter):
    """``GCN2Conv(graph, feat, feat_0)`` with whole-graph in-degree norms."""

    node_inputs = {"feat_0": "dst"}

    def __init__(self, conv: nn.Module) -> None:
        from dgl.nn.pytorch import GCN2Conv

        if type(conv).forward is not GCN2Conv.forward:
            reason = (
                "a subclass of GCN2Conv overriding forward: hopserve runs GCN2Conv's own "
                "steps with whole-graph degrees, not the subclass's"
            )
            raise UnsupportedConvError(f"{type(conv).__name__}: {reason}", reason)
        super().__init__(conv, pair=False)
        self._in_degrees: Tensor | None = None  # int64 [N], the whole graph's
        self._out_weights: Tensor | None = None  # [N] weighted out-degrees (edge weights)
        self._on_device: dict[tuple[str, str], Tensor] = {}  # tables copied to a device once
        self._max_in_degree = 0
        self._degrees_key: object | None = None
        self._graph = None  # the prepared GraphStore (sampled out-weights read its CSC)
        self._sampled_out: OrderedDict[tuple, Tensor] = OrderedDict()
        self._sample_lock = threading.Lock()

    def set_edge_inputs(self, inputs, model_edge_args, model_name, edge_feature_dim=None):  # noqa: ANN001
        for inp in inputs:
            if inp.param != "edge_weight" or inp.column != "weight":
                reason = "GCN2Conv takes edge weights (edge_weight) only"
                raise UnsupportedConvError(
                    f"GCN2Conv called with '{inp.arg}' as {inp.param}: {reason}", reason
                )
        super().set_edge_inputs(inputs, model_edge_args, model_name, edge_feature_dim)

    @property
    def weighted(self) -> bool:
        return bool(self.edge_inputs)

    @property
    def supports_global_src(self) -> bool:
        return False

    def edge_bytes(self, src_row_bytes: int) -> int:
        # A CSR SpMM: an index and a value per edge; weighted, the gathered weight, the
        # two ends' norms, the product and the int64 destination index per edge too.
        return 44 if self.weighted else 16

    def prepare(self, graph) -> None:  # graph: GraphStore
        key = (id(graph), getattr(graph, "version", None))
        super().prepare(graph)  # binds the edge columns first
        if key == self._degrees_key:
            return
        deg = torch.from_numpy(np.asarray(graph.topology.in_degrees)).long()
        out_weights = self._whole_graph_out_weights(graph) if self.weighted else None
        with self._lock:
            self._in_degrees, self._out_weights = deg, out_weights
            self._on_device = {}
            self._max_in_degree = int(deg.max()) if deg.numel() else 0
            self._graph = graph
        with self._sample_lock:
            self._sampled_out.clear()
        self._degrees_key = key

    def _whole_graph_out_weights(self, graph) -> Tensor:  # noqa: ANN001 - a GraphStore
        """:math:`\\sum_{v} w_{uv}` per source ``u`` (float32 ``[N]``), after refusing the
        weights DGL's ``EdgeWeightNorm("both")`` raises on."""
        from hopserve.worker.trace.tracer import ModelTraceError

        w = self._edge_columns["weight"]
        bad = (w <= 0).nonzero().squeeze(1)
        if bad.numel():
            first = int(bad[0])
            dst = int(np.searchsorted(graph.topology.indptr, first, side="right") - 1)
            ends = graph.to_external(torch.tensor([int(graph.indices[first]), dst])).tolist()
            name = f"'{self.qualname}' " if self.qualname else ""
            raise ModelTraceError(
                f"DGL conv {name}(GCN2Conv) normalizes edge weights with "
                f'EdgeWeightNorm("both"), which needs positive weights: {bad.numel()} '
                f"edge(s) of the graph have weight <= 0 (edge {ends[0]} -> {ends[1]}: "
                f"{float(w[first])!r}); the model's own forward raises DGLError on this "
                "graph too"
            )
        out = torch.zeros(graph.num_nodes, dtype=w.dtype)
        return out.index_add_(0, graph.indices.long(), w)

    def _table_on(self, name: str, table: Tensor, device: torch.device) -> Tensor:
        """``table`` on ``device``, copied there once per graph."""
        if device.type == "cpu":
            return table
        with self._lock:
            key = (name, str(device))
            cached = self._on_device.get(key)
            if cached is None:
                cached = self._on_device[key] = table.to(device)
        return cached

    def _sampled(self, s: Sampling | None) -> bool:
        return s is not None and s.fanout < self._max_in_degree

    def _source_out_weights(self, batch: LayerBatch) -> Tensor:
        """Weighted out-degree per storage node in ``batch``'s graph (whole graph or
        :math:`G_l`), on the batch's device; :math:`G_l`'s made once per sampling."""
        s, device = batch.sampling, batch.src_nodes.device
        if not self._sampled(s):
            return self._table_on("out_weights", self._out_weights, device)
        key = (s, str(device), self._degrees_key)  # a table of this graph version only
        with self._sample_lock:
            table = self._sampled_out.get(key)
            if table is not None:
                self._sampled_out.move_to_end(key)
                return table
        topo = self._graph.topology
        w = self._edge_columns["weight"].numpy()
        out = sampled_out_degrees(
            topo.indptr, topo.indices, topo.num_nodes, s.fanout, s.layer, s.seed, weights=w
        )
        table = torch.from_numpy(out).to(device=device, dtype=self._out_weights.dtype)
        with self._sample_lock:
            self._sampled_out[key] = table
            while len(self._sampled_out) > SAMPLED_CACHE_SIZE:
                self._sampled_out.popitem(last=False)
        return table

    def _aggregate(self, x: Tensor, batch: LayerBatch) -> Tensor:
        """:math:`\\sum_u a_{uv} h_u` for the batch's destinations (module doc)."""
        if not self.weighted:
            deg = self._table_on("in_degrees", self._in_degrees, batch.src_nodes.device)
            deg = deg[batch.src_nodes]
            if self._sampled(batch.sampling):
                deg = deg.clamp(max=batch.sampling.fanout)  # G_l's in-degree
            norm = deg.to(x).clamp(min=1).pow(-0.5).unsqueeze(1)
            return torch.sparse.mm(batch.adj_t(dtype=x.dtype), x * norm) * norm[: batch.num_dst]
        w = self.edge_values(batch)["edge_weight"].to(x.dtype)
        src_norm = self._source_out_weights(batch).to(x.dtype)[batch.src_nodes].pow(-0.5)
        in_w = torch.zeros(batch.num_dst, dtype=x.dtype, device=x.device)
        in_w.index_add_(0, batch.dst_index, w)
        a = src_norm[batch.src_index] * in_w.pow(-0.5)[batch.dst_index] * w
        return torch.sparse.mm(batch.adj_t(a, dtype=x.dtype), x)

    def run(self, x: Tensor, batch: LayerBatch, feat_0: Tensor) -> Tensor:  # type: ignore[override]
        conv = self.conv
        feat = self._aggregate(x, batch) * (1 - conv.alpha)
        feat_0 = feat_0 * conv.alpha
        feat_sum = feat + feat_0
        if conv._project_initial_features:
            projected = feat_sum @ conv.weight1
        else:
            projected = feat @ conv.weight1 + feat_0 @ conv.weight2
        out = (1 - conv.beta) * feat_sum + conv.beta * projected
        if conv._bias:
            out = out + conv.bias
        return out if conv._activation is None else conv._activation(out)
