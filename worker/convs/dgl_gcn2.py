r"""DGL ``GCN2Conv`` on a batch: in-degree normalization from the whole graph, and the
initial representation :math:`x_0` read on the destination rows.

.. math::
    \tilde h_v = (1-\alpha)\, c_v \sum_{u \in N_{in}(v)} c_u h_u + \alpha\, x_{0,v},
    \qquad c_u = \max(1, d^{in}_u)^{-1/2}

    h_v' = \sigma\big((1-\beta)\,\tilde h_v + \beta\,\tilde h_v W_1 + b\big)

(with ``project_initial_features=False`` the projection is :math:`(\tilde h_v - \alpha
x_{0,v}) W_1 + \alpha x_{0,v} W_2`). DGL normalizes sources by their *in*-degree, as its
forward computes ``graph.in_degrees()`` once for every node. A batch sees only its
destinations' in-edges, so :math:`d^{in}_u` of a source comes from the whole graph
(``prepare``), and so is every destination's (equal to its batch's on an exact batch).
Sampled batches (:math:`G_l`, every node
keeping ``min(d, f)`` in-edges) use :math:`\min(d^{in}_u, f)`, which is what the forward on
:math:`G_l` counts. :math:`x_0` is a per-node input (``ConvAdapter.node_inputs``:
``feat_0`` on ``dst`` rows). Edge weights (``EdgeWeightNorm("both")`` over weighted
out- and in-degrees) are refused at load, and so is a subclass overriding ``forward``
(the adapter runs ``GCN2Conv``'s own steps).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch, UnsupportedConvError
from hopserve.worker.convs.dgl_conv import DGLConvAdapter


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
        self._on_device: dict[str, Tensor] = {}  # the same, copied to a device once
        self._max_in_degree = 0
        self._degrees_key: object | None = None

    def set_edge_inputs(self, inputs, model_edge_args, model_name, edge_feature_dim=None):  # noqa: ANN001
        if inputs:
            reason = (
                "with edge_weight, GCN2Conv normalizes by weighted whole-graph out- and "
                "in-degrees (EdgeWeightNorm), which hopserve does not adapt"
            )
            raise UnsupportedConvError(f"GCN2Conv called with '{inputs[0].arg}': {reason}", reason)
        super().set_edge_inputs(inputs, model_edge_args, model_name, edge_feature_dim)

    @property
    def supports_global_src(self) -> bool:
        return False

    def edge_bytes(self, src_row_bytes: int) -> int:
        return 16  # a CSR SpMM: an index and a value per edge

    def prepare(self, graph) -> None:  # graph: GraphStore
        key = (id(graph), getattr(graph, "version", None))
        if key != self._degrees_key:
            deg = torch.from_numpy(np.asarray(graph.topology.in_degrees)).long()
            self._in_degrees = deg
            self._on_device = {}
            self._max_in_degree = int(deg.max()) if deg.numel() else 0
            self._degrees_key = key
        super().prepare(graph)

    def _degrees_on(self, device: torch.device) -> Tensor:
        """The in-degree table on ``device``, copied there once per graph."""
        if device.type == "cpu":
            return self._in_degrees
        with self._lock:
            table = self._on_device.get(str(device))
            if table is None:
                table = self._on_device[str(device)] = self._in_degrees.to(device)
        return table

    def run(self, x: Tensor, batch: LayerBatch, feat_0: Tensor) -> Tensor:  # type: ignore[override]
        conv = self.conv
        deg = self._degrees_on(batch.src_nodes.device)[batch.src_nodes]
        s = batch.sampling
        if s is not None and s.fanout < self._max_in_degree:
            deg = deg.clamp(max=s.fanout)  # G_l's in-degree
        norm = deg.to(x).clamp(min=1).pow(-0.5).unsqueeze(1)
        h = torch.sparse.mm(batch.adj_t(dtype=x.dtype), x * norm) * norm[: batch.num_dst]
        feat = h * (1 - conv.alpha)
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
