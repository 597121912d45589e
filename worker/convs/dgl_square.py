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

``EGNNConv`` takes node coordinates besides ``x`` (``coord_feat``, a per-node input on
source rows, see ``ConvAdapter.node_inputs``) and returns ``(h, coordinates)``, both node
rows: ``node_outputs=2`` slices both to the destination rows. Its messages read the two
ends of each edge (their coordinates' difference), and it averages coordinates over a
destination's in-edges, which the batch holds.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hopserve.worker.convs.base import ConvAdapter, LayerBatch


class DGLSquareAdapter(ConvAdapter):
    """Runs a DGL conv on the square graph of a batch; destination rows sliced out."""

    accepts_edge_data = True
    qualname = ""

    def __init__(self, conv, *, node_inputs: tuple[str, ...] = (), node_outputs: int = 1) -> None:  # noqa: ANN001
        super().__init__(conv)
        self.node_inputs = dict.fromkeys(node_inputs, "src")
        self.node_outputs = node_outputs

    def edge_bytes(self, src_row_bytes: int) -> int:
        if self.node_inputs:  # EGNN: both ends' rows, the edge MLP's layers, coordinates
            return 4 * src_row_bytes
        return super().edge_bytes(src_row_bytes)

    def src_bytes(self, src_row_bytes: int) -> int:
        # The square graph runs the node update over every source row, not destinations only.
        return 2 * src_row_bytes if self.node_inputs else 0

    def prepare(self, graph) -> None:  # graph: GraphStore
        from hopserve.worker.convs.dgl_conv import check_zero_in_degree

        self.bind_edge_data(graph)
        check_zero_in_degree(self.conv, graph, self.qualname)

    def run(
        self, x: Tensor, batch: LayerBatch, **node_inputs: Tensor
    ) -> Tensor | tuple[Tensor, ...]:
        import dgl

        src, dst, n_src = batch.src_index, batch.dst_index, batch.num_src
        edge = self.edge_values(batch) if self.edge_inputs else {}
        if batch.num_edges == 0:  # one extra self-looped node (see the module doc)
            src = dst = torch.full((1,), n_src, dtype=src.dtype, device=src.device)
            x = _one_more_row(x)
            node_inputs = {k: _one_more_row(v) for k, v in node_inputs.items()}
            n_src += 1
            edge = {k: v.new_zeros((1, *v.shape[1:])) for k, v in edge.items()}
        graph = dgl.graph((src, dst), num_nodes=n_src)
        out = self.conv(graph, x, **node_inputs, **edge)
        if isinstance(out, tuple):
            k = self.node_outputs
            return (*(o[: batch.num_dst] for o in out[:k]), *out[k:])
        return out[: batch.num_dst]


def _one_more_row(t: Tensor) -> Tensor:
    return torch.cat([t, t.new_zeros((1, *t.shape[1:]))])
