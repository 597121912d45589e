"""Relational GCN layers as one typed aggregation and one GEMM per batch.

PyG's ``RGCNConv`` and DGL's ``RelGraphConv`` compute, for destination ``v``,

.. math::
    h_v' = \\sum_{r} W_r \\, \\mathrm{agg}_{u \\in N_r(v)} x_u \\;+\\; \\text{root / self-loop}
    \\;+\\; b

(``agg`` a sum, or PyG's mean per relation). ``W_r`` is linear, so aggregating first is the
same function: the batch's in-edges are summed into ``A_t x`` of shape ``[B, R, d_in]``
(row ``v * R + r``: the in-edges of ``v`` with relation ``r``, one torch CSR SpMM), and
``[B, R * d_in] @ [R * d_in, d_out]`` applies every ``W_r`` at once. DGL's own forward
multiplies ``W_{r(e)}`` into every edge (a gather-matmul of ``E * d_in * d_out``
multiply-adds); PyG's loops over relations with one masked propagation each. Results
equal theirs up to float summation order (the tests' tolerance). Bases and block-diagonal
weights are expanded to ``[R, d_in, d_out]`` once per call (``R * d_in * d_out``).

The aggregation reads raw source rows, so full layers read the node table in place
(``supports_global_src``). PyG ``aggr="max"`` is not linear: such convs keep the generic
adapter (the registry picks it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch, UnsupportedConvError

__all__ = ["DGLRelGraphConvAdapter", "RGCNAdapter", "typed_aggregate"]


def typed_aggregate(
    batch: LayerBatch, x: Tensor, relation: Tensor, num_relations: int, mean: bool
) -> Tensor:
    """``[B, R, d]``: per destination and relation, the sum (or mean) of its in-edges'
    source rows; zero where a destination has no in-edge of that relation."""
    b, r = batch.num_dst, num_relations
    key = batch.dst_index * r + relation
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=b * r)
    crow = torch.zeros(b * r + 1, dtype=torch.int64, device=x.device)
    torch.cumsum(counts, 0, out=crow[1:])
    if mean:
        values = (1.0 / counts.clamp(min=1).to(x.dtype)).repeat_interleave(counts)
    else:
        values = torch.ones(key.numel(), dtype=x.dtype, device=x.device)
    adj = torch.sparse_csr_tensor(
        crow, batch.src_index[order], values, size=(b * r, batch.num_src), check_invariants=False
    )
    return (adj @ x.reshape(x.shape[0], -1)).view(b, r, -1)


def block_diagonal(blocks: Tensor) -> Tensor:
    """``[R, nb, si, so]`` per-relation diagonal blocks -> dense ``[R, nb*si, nb*so]``."""
    r, nb, si, so = blocks.shape
    out = blocks.new_zeros(r, nb * si, nb * so)
    for k in range(nb):
        out[:, k * si : (k + 1) * si, k * so : (k + 1) * so] = blocks[:, k]
    return out


class _TypedLinearAdapter(ConvAdapter):
    """Shared: the typed aggregation, one GEMM, then the conv's own node-wise terms."""

    accepts_edge_data = True
    mean = False

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv)
        self._avg_degree = 1.0

    def set_edge_inputs(self, inputs, model_edge_args, model_name, edge_feature_dim=None):  # noqa: ANN001
        if [i.column for i in inputs] != ["type"]:
            given = ", ".join(f"'{i.arg}' as '{i.param}'" for i in inputs) or "none"
            raise UnsupportedConvError(
                f"{type(self.conv).__name__} takes the relation id of each edge (an "
                f"edge_type-like argument) and no other edge data; it is given {given}"
            )
        super().set_edge_inputs(inputs, model_edge_args, model_name, edge_feature_dim)

    def prepare(self, graph) -> None:  # noqa: ANN001 - a GraphStore
        super().prepare(graph)
        self._avg_degree = max(1.0, float(getattr(graph, "avg_degree", 1.0)))

    @property
    def supports_global_src(self) -> bool:
        return True

    def edge_bytes(self, src_row_bytes: int) -> int:
        # key, order, counts, column and value per edge; the [R, d_in] float32 aggregated
        # rows of each destination, spread over its in-edges. Not src_row_bytes: a full
        # layer gathers nothing (0), but the aggregated rows are still allocated.
        rows = self.relation_count() * self.in_width() * 4 / self._avg_degree
        return 40 + int(rows)

    def relation_count(self) -> int:
        raise NotImplementedError

    def in_width(self) -> int:
        """``d_in``: the width of the source rows the conv aggregates."""
        raise NotImplementedError

    def weights(self) -> Tensor:
        """``[R, d_in, d_out]``."""
        raise NotImplementedError

    def relations(self, batch: LayerBatch) -> Tensor:
        (values,) = self.edge_values(batch).values()
        return values

    def aggregate(self, x: Tensor, batch: LayerBatch) -> Tensor:
        """``sum_r agg_r(x) W_r`` for the batch's destinations, ``[B, d_out]``."""
        w = self.weights()
        r, d_in, d_out = w.shape
        agg = typed_aggregate(batch, x, self.relations(batch), r, self.mean)
        return agg.reshape(batch.num_dst, r * d_in) @ w.reshape(r * d_in, d_out)


class RGCNAdapter(_TypedLinearAdapter):
    """PyG ``RGCNConv`` / ``FastRGCNConv`` with ``aggr`` ``"mean"`` or ``"add"``/``"sum"``."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv)
        self.mean = conv.aggr == "mean"

    def relation_count(self) -> int:
        return int(self.conv.num_relations)

    def in_width(self) -> int:
        return int(self.conv.in_channels_l)

    def weights(self) -> Tensor:
        conv = self.conv
        w = conv.weight
        if conv.num_bases is not None:
            w = (conv.comp @ w.view(conv.num_bases, -1)).view(
                conv.num_relations, conv.in_channels_l, conv.out_channels
            )
        elif conv.num_blocks is not None:
            w = block_diagonal(w)
        return w

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        conv = self.conv
        out = self.aggregate(x, batch)
        if conv.root is not None:
            out = out + batch.dst_rows(x) @ conv.root
        if conv.bias is not None:
            out = out + conv.bias
        return out


class DGLRelGraphConvAdapter(_TypedLinearAdapter):
    """DGL ``RelGraphConv`` called without ``norm`` (sum over in-edges)."""

    def relation_count(self) -> int:
        return int(self.conv.linear_r.num_types)

    def in_width(self) -> int:
        return int(self.conv.linear_r.in_size)

    def weights(self) -> Tensor:
        lin = self.conv.linear_r
        if lin.regularizer == "bdd":
            nb = lin.num_bases
            return block_diagonal(lin.W.view(lin.num_types, nb, lin.submat_in, lin.submat_out))
        return lin.get_weight()

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        conv = self.conv
        h = self.aggregate(x, batch)
        if conv.layer_norm:
            h = conv.layer_norm_weight(h)
        if conv.bias:
            h = h + conv.h_bias
        if conv.self_loop:
            h = h + batch.dst_rows(x) @ conv.loop_weight
        if conv.activation:
            h = conv.activation(h)
        return conv.dropout(h)
