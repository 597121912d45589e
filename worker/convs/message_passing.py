"""Default adapter for PyG ``MessagePassing`` convs that aggregate 1-hop in-neighbours.

.. math::
    h_v' = \\gamma\\big(h_v,\\ \\bigoplus_{u \\in N_{in}(v)} \\phi(h_v, h_u)\\big)

Exactness: the batch holds every in-edge of each destination (destination-first source
rows), so :math:`N_{in}(v)` and :math:`h_v` are complete for every destination row, and
every per-destination statistic the conv computes from its edges sees what the full graph
gives it: a softmax over in-edges (GAT, GENConv's softmax aggregation), the in-degree
(``MFConv``'s degree-specific weights, ``PNAConv``'s degree scalers, ``ClusterGCNConv``'s
normalization), a std or a max. Self-loop handling inside the conv (``add_self_loops``)
sees the destination's own row at the same local index.

Pair convs (``forward`` takes ``(x_src, x_dst)``) get the source rows and the destination
rows and produce destination rows only. Square convs (``forward`` takes one tensor:
``PNAConv``, ``AGNNConv``, ``ClusterGCNConv``, ``SuperGATConv``) run on the square batch
graph over all source rows: its edges all point at destinations, so every other row's
output (over no in-edges, or only a self-loop the conv adds) is computed and sliced away,
and never feeds a destination row.

Layout: for sum/mean aggregations on pair convs with a fused ``message_and_aggregate``
the batch is passed as a sparse CSR ``adj_t`` (one SpMM, no ``[E, d]`` message tensor);
otherwise as ``edge_index``.

Positions: point-cloud convs (``PointNetConv``, ``PPFConv``, ``PointTransformerConv``,
``PointGNNConv``) take per-node positions (and normals) besides ``x``, computed by the model
from the features; they arrive as ``node_inputs`` on source rows and are passed by name,
as pairs on pair convs. Every message reads ``pos_j - pos_i`` of its edge's two ends.

Edge data: a conv called with ``edge_weight`` / ``edge_attr`` gets the store column's rows
of the batch's edges (``column[batch.edge_ids]``), aligned with ``edge_index``, through the
unfused path. Exactness is unchanged: every per-edge value a conv computes from its edge's
data (GINE's ``x_j + lin(e)``, NNConv's edge-conditioned weights, GAT's edge term of the
attention logit) sees the same row as in the full graph, and the self-loops a conv adds
with a per-destination fill (GAT's ``fill_value="mean"``: the mean of the destination's
in-edge features) read every in-edge of the destination, which the batch holds.
"""

from __future__ import annotations

import inspect

from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch

_FUSABLE_AGGRS = {"add", "sum", "mean"}


def _overrides(conv: nn.Module, method: str) -> bool:
    from torch_geometric.nn import MessagePassing

    return getattr(type(conv), method, None) is not getattr(MessagePassing, method, None)


def aggregates_raw_sources(conv: nn.Module) -> bool:
    """Whether the conv aggregates its source rows as they are (no transform before the
    sum / mean), so it can read a stored node table in place through global source ids;
    its square and pair forms then agree (no self-loops added)."""
    from torch_geometric.nn import GINConv, GraphConv, SAGEConv

    if isinstance(conv, SAGEConv):
        return not conv.project
    return type(conv) in (GraphConv, GINConv)


def fuses_sparse_aggregation(conv: nn.Module) -> bool:
    """Whether the conv aggregates a sparse ``adj_t`` in one SpMM (a sum or mean with its
    own ``message_and_aggregate``): no ``[E, d]`` message tensor."""
    aggr = getattr(conv, "aggr", None)
    return (
        isinstance(aggr, str)
        and aggr in _FUSABLE_AGGRS
        and _overrides(conv, "message_and_aggregate")
    )


class MessagePassingAdapter(ConvAdapter):
    """Runs ``conv((x_src, x_dst), adj)`` (pair) or ``conv(x, edge_index)[:B]`` (square)."""

    accepts_edge_data = True

    def __init__(
        self,
        conv: nn.Module,
        *,
        pair: bool = True,
        fuse: bool = True,
        node_inputs: tuple[str, ...] = (),
    ) -> None:
        super().__init__(conv)
        self.pair = pair
        self.node_inputs = dict.fromkeys(node_inputs, "src")
        # A square batch is never fused: its [B, n_src] adjacency is not square, and a
        # conv given one tensor would mix n_src root rows with B aggregated rows.
        self.use_csr = fuse and pair and fuses_sparse_aggregation(conv)
        self._takes_size = "size" in inspect.signature(conv.forward).parameters

    @property
    def supports_global_src(self) -> bool:
        # Convs that aggregate raw source rows before any transform can read the stored
        # node table directly through a CSR with global column ids.
        return (
            self.use_csr
            and self.pair
            and not self.edge_inputs
            and not self.node_inputs
            and aggregates_raw_sources(self.conv)
        )

    def edge_bytes(self, src_row_bytes: int) -> int:
        if self.node_inputs:  # point convs: message inputs, an MLP's layers, attention
            return 4 * src_row_bytes
        # Fused SpMM materializes no messages: a column index and a value per edge.
        if self.edge_inputs:  # messages, plus the gathered edge rows
            return src_row_bytes + 4 * (1 + (self.edge_feature_dim or 0))
        return 12 if self.use_csr else src_row_bytes

    def run(self, x: Tensor, batch: LayerBatch, **node_inputs: Tensor) -> Tensor:
        n_dst = batch.num_dst
        if node_inputs:  # by name: the conv's forward may take them before edge_index
            edge = self.edge_values(batch)
            if not self.pair:
                return self.conv(x, edge_index=batch.edge_index, **node_inputs, **edge)[:n_dst]
            pairs = {p: (t, t[:n_dst]) for p, t in node_inputs.items()}
            return self.conv((x, x[:n_dst]), edge_index=batch.edge_index, **pairs, **edge)
        if self.edge_inputs:
            edge = self.edge_values(batch)
            if self.pair:
                if self._takes_size:
                    edge["size"] = (batch.num_src, n_dst)
                return self.conv((x, x[:n_dst]), batch.edge_index, **edge)
            return self.conv(x, batch.edge_index, **edge)[:n_dst]
        if self.use_csr:
            adj = batch.adj_t(dtype=x.dtype)
            inp = (x, batch.dst_rows(x)) if self.pair else x
            out = self.conv(inp, adj)
            return out if self.pair else out[:n_dst]
        if self.pair:
            kwargs = {"size": (batch.num_src, n_dst)} if self._takes_size else {}
            return self.conv((x, x[:n_dst]), batch.edge_index, **kwargs)
        return self.conv(x, batch.edge_index)[:n_dst]
