"""DGL ``PNAConv`` (and ``DGNConv`` without directional aggregators) on a batch.

.. math::
    h_v' = \\mathrm{mix}\\Big(\\big\\Vert_t\\ \\mathrm{BN}\\big(\\tfrac{1}{\\sqrt{N}}\\,
           U_t\\big(h_v,\\ \\bigoplus_{s,a} s(d_v)\\, a_{u \\in N_{in}(v)}
           M_t(h_u, h_v)\\big)\\big)\\Big) \\;(+\\, h_v)

per tower :math:`t`, aggregators :math:`a` (mean, max, std, …) and degree scalers
:math:`s` (identity, amplification :math:`\\log(d_v+1)/\\delta`, attenuation).

Exactness: every aggregator and scaler reads the destination's own in-edges (the
scalers its in-degree :math:`d_v`, the mailbox size), which a batch holds in full;
:math:`\\delta` is a constructor constant. The one whole-graph quantity is DGL's graph-size
normalization :math:`1/\\sqrt{N}`, :math:`N` the number of nodes of the graph the forward
runs on (``graph.batch_num_nodes()``): a batch graph has fewer. ``prepare`` records the
whole graph's :math:`N`; each batch runs the conv's own forward on the square batch graph
(its ``n_src`` nodes, the destinations first) through a view whose towers' ``U`` is
scaled by :math:`\\sqrt{n_{src} / N}`, so the tower's own ``h * snorm`` equals the
full-graph :math:`U/\\sqrt{N}` (up to rounding). The destination rows are sliced out; the
other rows (no in-edges in the batch) are never read; a batch without edges (only
zero-in-degree destinations, whose full-graph aggregate is zeros) gets one extra,
self-looped node so that DGL creates the aggregate at all. Sampling evaluation: the model's
forward on :math:`G_l` has the same :math:`N`. Edge features (``edge_feat``): the rows of
the batch's edges, which are the square graph's edges in order.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch


class _Scaled(nn.Module):
    """``module(x) * scale`` (a tower's ``U`` for one batch)."""

    def __init__(self, module: nn.Module, scale: float) -> None:
        super().__init__()
        self.module = module
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x) * self.scale


class DGLPNAAdapter(ConvAdapter):
    """Runs DGL ``PNAConv`` exactly on a batch with the whole graph's node count."""

    accepts_edge_data = True  # edge_feat: the batch's edges' rows (edge i of the square graph)

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv)
        self._num_nodes: int | None = None

    def prepare(self, graph) -> None:  # graph: GraphStore
        self.bind_edge_data(graph)
        self._num_nodes = int(graph.num_nodes)

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        import dgl

        assert self._num_nodes is not None, "prepare(graph) runs before the first batch"
        src, dst, n_src = batch.src_index, batch.dst_index, batch.num_src
        edge = self.edge_values(batch) if self.edge_inputs else {}
        if batch.num_edges == 0:
            # DGL creates no reduced field on an edgeless graph (the full graph gives
            # zero-in-degree nodes zeros): one extra node with a self-loop, never read.
            src = dst = torch.full((1,), n_src, dtype=src.dtype, device=src.device)
            x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
            n_src += 1
            edge = {k: v.new_zeros((1, *v.shape[1:])) for k, v in edge.items()}
        square = dgl.graph((src, dst), num_nodes=n_src)  # edge i: the batch's edge i
        return self._view(n_src)(square, x, **edge)[: batch.num_dst]

    def _view(self, n_src: int) -> nn.Module:
        """The conv with each tower's ``U`` scaled by ``sqrt(n_src / N)``; weights shared."""
        scale = math.sqrt(n_src / self._num_nodes)
        towers = []
        for tower in self.conv.towers:
            view = copy.copy(tower)  # a new __dict__ and module dict; parameters shared
            view.__dict__["_modules"] = {**tower._modules, "U": _Scaled(tower.U, scale)}
            towers.append(view)
        conv = copy.copy(self.conv)
        conv.__dict__["_modules"] = {**self.conv._modules, "towers": nn.ModuleList(towers)}
        return conv
