"""DGL convs that run on a whole ``DGLGraph`` only (they read ``graph.ndata``): the square batch graph.

.. math::
    h_v' = \\gamma\\big(h_v,\\ \\bigoplus_{u \\in N_{in}(v)} \\phi(h_v, h_u, e_{uv})\\big)

``GatedGCNConv`` writes ``graph.ndata``, which a DGL block (source and destination node
types) does not have. Its batch runs as a plain graph over the batch's ``n_src`` source
rows (destinations first) with the batch's in-edges, edge ``i`` being the batch's edge
``i``, so edge data arguments are the store column's rows ``column[batch.edge_ids]``.

Exactness: every destination holds all its in-edges in the batch, so its gated sum (and
the per-edge gates, which read only the edge's two ends and its features) is the full
graph's; batch norm runs in eval mode (per row). The other rows of the square graph (no
in-edges in the batch) are computed and sliced away, never read. A batch without edges
gets one extra self-looped node with zero data, so DGL creates the aggregated fields at
all (a zero-in-degree node's full-graph aggregate is zeros). A conv returning ``(node rows,
edge rows)`` gives the destination rows of the first and its edge rows as they are: a
model may use the node rows only (per-edge outputs cannot cross layers).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hopserve.worker.convs.base import ConvAdapter, LayerBatch


class DGLSquareAdapter(ConvAdapter):
    """Runs a DGL conv on the square graph of a batch; destination rows sliced out."""

    accepts_edge_data = True
    qualname = ""

    def prepare(self, graph) -> None:  # graph: GraphStore
        from hopserve.worker.convs.dgl_conv import check_zero_in_degree

        self.bind_edge_data(graph)
        check_zero_in_degree(self.conv, graph, self.qualname)

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor | tuple[Tensor, ...]:
        import dgl

        src, dst, n_src = batch.src_index, batch.dst_index, batch.num_src
        edge = self.edge_values(batch) if self.edge_inputs else {}
        if batch.num_edges == 0:  # one extra self-looped node (see the module doc)
            src = dst = torch.full((1,), n_src, dtype=src.dtype, device=src.device)
            x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
            n_src += 1
            edge = {k: v.new_zeros((1, *v.shape[1:])) for k, v in edge.items()}
        out = self.conv(dgl.graph((src, dst), num_nodes=n_src), x, **edge)
        if isinstance(out, tuple):
            return (out[0][: batch.num_dst], *out[1:])
        return out[: batch.num_dst]
