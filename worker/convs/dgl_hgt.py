r"""DGL ``HGTConv`` (``conv(g, x, ntype, etype)``) on a batch: keys and values projected
once per source row, the per-relation maps moved to the destination side.

For an edge :math:`j \to i` of relation :math:`r`, head :math:`h` (:math:`D` = head size),
with the per-node-type maps :math:`k_j = x_j K_{s}`, :math:`v_j = x_j V_{s}`,
:math:`q_i = x_i Q_{t}` (``linear_k/v/q``, no bias), DGL's ``HGTConv`` computes

.. math::
    \sigma_{ij} = \frac{(k_j A_{h,r}) \cdot q_i \; \mu_{h,r}}{\sqrt D}, \quad
    \alpha_{ij} = \operatorname{softmax}_{j \in N_{in}(i)} \sigma_{ij}, \quad
    m_i = \sum_j \alpha_{ij}\, v_j M_{h,r}

(``relation_att``, ``relation_pri``, ``relation_msg``; the softmax over all of ``i``'s
in-edges). The relation maps are linear, so they move to the destinations:
:math:`\sigma_{ij} = k_j \cdot (A_{h,r} q_i)\, \mu_{h,r} / \sqrt D` and
:math:`m_i = \sum_r \big(\sum_{j \in N_r(i)} \alpha_{ij} v_j\big) M_{h,r}` — the same
function, summed in another order. A batch projects each of its gathered source rows
once (DGL's own forward multiplies every edge's key and value by its relation's
matrices); no whole-layer ``[k | v]`` table is kept (``2F`` values a row: more than the
layer's input and output together), and a hub's batch, whose table would outgrow
:data:`~.edge_chunks.KV_TABLE_BYTES`, projects its sources per chunk of edges instead. The
wide per-edge rows are made one chunk of edges at a time (:mod:`~.edge_chunks`). Then, as
``HGTConv`` does,
:math:`\mathrm{out}_i` = ``linear_a`` of :math:`m_i` by the destination's type, mixed with
:math:`x_i` (or :math:`x_i W_{res}`) by the type's skip gate, then ``norm`` when set.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch
from hopserve.worker.convs.dgl_conv import dgl_block
from hopserve.worker.convs.edge_chunks import edge_chunks, kv_table_fits

__all__ = ["DGLHGTAdapter"]


def _typed(weight: Tensor, x: Tensor, types: Tensor) -> Tensor:
    """DGL ``TypedLinear`` (no bias) of ``weight`` ``[num_types, in, out]``: row ``i``
    times its type's matrix, one GEMM a type."""
    return _typed_split(weight, x, types, (weight.shape[2],))[0]


def _typed_split(
    weight: Tensor, x: Tensor, types: Tensor, widths: tuple[int, ...]
) -> tuple[Tensor, ...]:
    """:func:`_typed`'s product (one GEMM a type), its columns split into contiguous
    tables ``widths`` wide."""
    outs = tuple(x.new_zeros(x.shape[0], w) for w in widths)
    for t in torch.unique(types).tolist():
        rows = (types == t).nonzero().squeeze(1)
        y = x.index_select(0, rows) @ weight[t]
        for out, part in zip(outs, y.split(widths, dim=1), strict=True):
            out.index_copy_(0, rows, part)
    return outs


_RowMap = Callable[[Tensor], Tensor]


class DGLHGTAdapter(ConvAdapter):
    """Runs DGL's ``HGTConv`` on a :class:`LayerBatch` (see the module doc)."""

    accepts_edge_data = True  # node type ids and relation ids, from the store's columns

    def edge_bytes(self, src_row_bytes: int) -> int:
        """Per in-edge: relation masks and edge lists, the scores and their softmax
        (``O(H)``); the wide rows are one chunk's (:mod:`~.edge_chunks`)."""
        return 64 + 24 * int(self.conv.num_heads)

    def src_bytes(self, src_row_bytes: int) -> int:
        """Per gathered source row: its ``[k | v]`` (``2F`` values)."""
        return 8 * int(self.conv.num_heads * self.conv.head_size)

    def _inputs(self, batch: LayerBatch) -> tuple[Tensor, Tensor]:
        """(node type of each source row, relation id of each edge)."""
        values = self.edge_values(batch)
        columns = {inp.column: inp.param for inp in self.edge_inputs}
        return values[columns["node_type"]], values[columns["type"]]

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        import dgl

        conv = self.conv
        heads, dim = conv.num_heads, conv.head_size
        f = heads * dim
        ntype, etype = self._inputs(batch)
        num_dst = batch.num_dst
        src, dst = batch.src_index, batch.dst_index
        keys, values = self._source_maps(x, ntype)
        dst_types = ntype[:num_dst]
        x_dst = batch.dst_rows(x)
        q = _typed(conv.linear_q.get_weight(), x_dst, dst_types).view(num_dst, heads, dim)
        att = torch.stack([m.get_weight() for m in conv.relation_att])  # [H, R, D, D]
        msg = torch.stack([m.get_weight() for m in conv.relation_msg])
        pri = torch.stack(list(conv.relation_pri)) / conv.sqrt_d  # [H, R]
        row_bytes = 3 * x.element_size() * f  # a chunk's gathered rows and their product
        score = x.new_empty(src.numel(), heads)
        relations = []
        for r in torch.unique(etype).tolist():
            on = (etype == r).nonzero().squeeze(1)
            src_r, dst_r = src.index_select(0, on), dst.index_select(0, on)
            q_rel = torch.einsum("nhd,hcd->nhc", q, att[:, r]).contiguous()  # A_{h,r} q_i
            for c in edge_chunks(on.numel(), row_bytes):
                k_j = keys(src_r[c]).view(-1, heads, dim)
                score[on[c]] = (q_rel.index_select(0, dst_r[c]) * k_j).sum(-1) * pri[:, r]
            relations.append((r, on, src_r, dst_r))
        alpha = dgl.ops.edge_softmax(dgl_block(batch), score)  # over each dst's in-edges
        del score
        m = x.new_zeros(num_dst, heads, dim)
        for r, on, src_r, dst_r in relations:
            a = alpha.index_select(0, on)
            agg = x.new_zeros(num_dst, heads, dim)
            for c in edge_chunks(on.numel(), row_bytes):
                v_j = values(src_r[c]).view(-1, heads, dim)
                agg.index_add_(0, dst_r[c], v_j * a[c].unsqueeze(-1))
            m += torch.einsum("nhc,hcd->nhd", agg, msg[:, r])
        h = conv.drop(_typed(conv.linear_a.get_weight(), m.view(num_dst, f), dst_types))
        gate = torch.sigmoid(conv.skip.index_select(0, dst_types)).unsqueeze(-1)
        if x_dst.shape != h.shape:
            h = h * gate + (x_dst @ conv.residual_w) * (1 - gate)
        else:
            h = h * gate + x_dst * (1 - gate)
        return conv.norm(h) if conv.use_norm else h

    def _source_maps(self, x: Tensor, ntype: Tensor) -> tuple[_RowMap, _RowMap]:
        """``(keys, values)``: each maps source rows ``idx`` of ``x`` (node types ``ntype``)
        to their ``k`` / ``v`` (``[len(idx), F]``), read from tables of every row, or
        projected per call when those would outgrow :data:`~.edge_chunks.KV_TABLE_BYTES`
        (a hub's batch)."""
        f = self.conv.num_heads * self.conv.head_size
        if not kv_table_fits(x.shape[0], 2 * f * x.element_size()):
            conv = self.conv

            def project(linear: nn.Module) -> _RowMap:
                return lambda idx: _typed(
                    linear.get_weight(), x.index_select(0, idx), ntype.index_select(0, idx)
                )

            return project(conv.linear_k), project(conv.linear_v)
        k, v = self._keys_values(x, ntype)
        return partial(torch.index_select, k, 0), partial(torch.index_select, v, 0)

    def _keys_values(self, x: Tensor, ntype: Tensor) -> tuple[Tensor, Tensor]:
        """``(k, v)`` of rows ``x`` of node types ``ntype`` (``[rows, F]`` each, contiguous:
        a row gather from one strided ``[k | v]`` table was ~3x slower)."""
        f = self.conv.num_heads * self.conv.head_size
        weight = torch.cat([self.conv.linear_k.get_weight(), self.conv.linear_v.get_weight()], 2)
        k, v = _typed_split(weight, x, ntype, (f, f))  # one grouping of the rows
        return k, v
