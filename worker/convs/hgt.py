r"""PyG ``HGTConv`` on a batch: keys and values projected once per source row, the
per-relation maps moved to the destination side.

For an edge :math:`j \to i` of relation :math:`r = (s, \cdot, t)`, head :math:`h`
(:math:`D = F / H`), with ``kqv_lin``'s per-type maps :math:`k_j, v_j` (of :math:`x_j`,
type :math:`s`) and :math:`q_i` (type :math:`t`), ``HGTConv`` computes

.. math::
    \sigma_{ij} = \frac{(q_i \cdot k_j W^k_{h,r})\, p_{r,h}}{\sqrt D}, \quad
    \alpha_{ij} = \operatorname{softmax}_{j \in N_{in}(i)} \sigma_{ij}, \quad
    m_i = \sum_j \alpha_{ij}\, v_j W^v_{h,r}

(the softmax over all of ``i``'s in-edges, across relations). The relation maps are
linear, so they move to the destinations:
:math:`\sigma_{ij} = (\tilde q_{ir} \cdot k_j)\, p_{r,h} / \sqrt D` with
:math:`\tilde q_{ir} = W^k_{h,r} q_i`, and
:math:`m_i = \sum_r \big(\sum_{j \in N_r(i)} \alpha_{ij} v_j\big) W^v_{h,r}`. The same
function, summed in another order.

So a batch projects each of its (gathered) source rows once (:math:`k_j, v_j`), never
per relation; a batch whose ``[k | v]`` rows would outgrow
:data:`~.edge_chunks.KV_TABLE_BYTES` (a hub batched alone: one row cannot be split, and
its sources can be a tenth of the graph) projects each chunk of edges' sources as it reads
them instead, so its workspace stays a chunk's whatever the hub's degree. The generic path
(:class:`~.hetero.DictConvAdapter`, the conv on the batch's typed subgraph) projects every
source through every relation map. No
whole-layer ``[k | v]`` table is kept: at ``2F`` values a row it would outweigh the layer's
input and output together. The wide per-edge rows are made one chunk of edges at a time
(:mod:`~.edge_chunks`): the scores of every in-edge, their softmax, then the weighted
values. Then, as ``HGTConv`` does,
:math:`\mathrm{out}_i = \mathrm{out\_lin}_t(\mathrm{gelu}(m_i))`, mixed with :math:`x_i`
by the type's learned skip gate when the widths agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch
from hopserve.worker.convs.edge_chunks import edge_chunks, kv_table_fits
from hopserve.worker.convs.hetero import DictConvAdapter
from hopserve.worker.hetero.modules import DictConvLayer

__all__ = ["HGTAdapter", "is_plain_hgt"]


def is_plain_hgt(layer: DictConvLayer) -> bool:
    """Whether ``layer`` runs PyG's ``HGTConv`` as written (a subclass that overrides its
    forward or message runs on the generic path)."""
    if layer.style != "pyg":
        return False
    try:
        from torch_geometric.nn import HGTConv
    except ImportError:  # pragma: no cover - a dict conv of another library
        return False
    conv = type(layer.conv)
    return (
        issubclass(conv, HGTConv)
        and conv.forward is HGTConv.forward
        and conv.message is HGTConv.message
    )


_RowMap = Callable[[Tensor], Tensor]


class HGTAdapter(DictConvAdapter):
    """Runs a :class:`DictConvLayer` over PyG ``HGTConv`` on a batch (see the module doc)."""

    def edge_bytes(self, src_row_bytes: int) -> int:
        """Per in-edge: relation masks and edge lists, the scores and their softmax
        (``O(H)``); the wide rows are one chunk's (:mod:`~.edge_chunks`)."""
        return 64 + 24 * int(self.conv.conv.heads)

    def src_bytes(self, src_row_bytes: int) -> int:
        """Per gathered source row: its ``[k | v]`` (``2F`` values)."""
        return 8 * int(self.conv.conv.out_channels)

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        layer: DictConvLayer = self.conv
        conv = layer.conv
        layout = layer.layout
        names, index = layout.names, layout.names.index
        device = x.device
        num_dst = batch.num_dst
        src, dst = batch.src_index, batch.dst_index
        keys, values = self._source_maps(x, batch.src_nodes)
        x_dst = batch.dst_rows(x)
        dst_types = layout.types_of(batch.dst_nodes, num_dst, device)
        outputs = sorted({index(k[2]) for k in conv.edge_types} & set(layer.in_widths))
        rows = {t: (dst_types == t).nonzero().squeeze(1) for t in outputs}
        q = self._queries(x_dst, rows)
        # One pass over the relations, every edge's destination its batch row (the
        # softmax runs over each destination's in-edges across relations). A typed
        # store's relation-r edges all run s -> t; the load-time probe graph's need not,
        # and HGTConv's forward ignores the others.
        edge_type = self.edge_values(batch)["edge_type"]
        src_types = layout.types_of(batch.src_nodes, 0, device).index_select(0, src)
        edge_dst_types = dst_types.index_select(0, dst)
        relations = []
        for rel, key in layer.relations:
            if index(key[2]) not in rows:
                continue  # into a type the layer does not output
            on = edge_type == rel
            on &= src_types == index(key[0])
            on &= edge_dst_types == index(key[2])
            on = on.nonzero().squeeze(1)
            relations.append((key, src.index_select(0, on), dst.index_select(0, on)))
        del edge_type, src_types, edge_dst_types
        m = self._messages(
            conv, keys, values, q, relations, {names[t]: sel for t, sel in rows.items()}
        )
        out = x.new_zeros((num_dst, *layer.out_shape))
        for t, sel in rows.items():
            if sel.numel() == 0:
                continue
            x_t = x_dst.index_select(0, sel)[:, : layer.in_widths[t]]
            y = conv.out_lin.lins[names[t]](nn.functional.gelu(m.index_select(0, sel)))
            if y.shape[-1] == x_t.shape[-1]:
                gate = conv.skip[names[t]].sigmoid()
                y = gate * y + (1 - gate) * x_t
            out[sel, : y.shape[1]] = y
        return out

    def _queries(self, x_dst: Tensor, rows: dict[int, Tensor]) -> Tensor:
        """``q`` (``[B, F]``) of the destination rows ``rows`` (per type)."""
        f = self.conv.conv.out_channels
        return self._projected(x_dst, rows, (slice(f, 2 * f),))[0]

    def _source_maps(self, x: Tensor, node_ids: Tensor) -> tuple[_RowMap, _RowMap]:
        """``(keys, values)``: each maps source rows ``idx`` of ``x`` (storage ids
        ``node_ids``) to their ``k`` / ``v`` (``[len(idx), F]``), read from a ``[k | v]``
        table of every row, or projected per call when that table would outgrow
        :data:`~.edge_chunks.KV_TABLE_BYTES`."""
        layer: DictConvLayer = self.conv
        f = layer.conv.out_channels
        types = layer.layout.types_of(node_ids, x.shape[0], x.device)
        k_part, v_part = slice(0, f), slice(2 * f, 3 * f)
        if not kv_table_fits(x.shape[0], 2 * f * x.element_size()):

            def project(part: slice) -> _RowMap:
                def rows_of(idx: Tensor) -> Tensor:
                    kinds = types.index_select(0, idx)
                    sel = {t: (kinds == t).nonzero().squeeze(1) for t in layer.in_widths}
                    return self._projected(x.index_select(0, idx), sel, (part,))[0]

                return rows_of

            return project(k_part), project(v_part)
        rows = {t: (types == t).nonzero().squeeze(1) for t in layer.in_widths}
        # Two contiguous tables: a row gather from one strided [k | v] table was ~3x slower.
        k, v = self._projected(x, rows, (k_part, v_part))
        return partial(torch.index_select, k, 0), partial(torch.index_select, v, 0)

    def _projected(
        self, x: Tensor, rows: dict[int, Tensor], parts: tuple[slice, ...]
    ) -> tuple[Tensor, ...]:
        """Rows ``rows[t]`` of ``x`` through type ``t``'s ``kqv_lin`` (one product for every
        part), its output columns ``parts`` each as its own contiguous ``[rows, width]``;
        rows of other types, or of types without a map, are 0."""
        layer: DictConvLayer = self.conv
        lins = layer.conv.kqv_lin.lins
        outs = tuple(x.new_zeros(x.shape[0], p.stop - p.start) for p in parts)
        for t, sel in rows.items():
            name = layer.layout.names[t]
            if sel.numel() == 0 or name not in lins:
                continue
            lin = lins[name]
            weight = torch.cat([lin.weight[p] for p in parts])
            bias = None if lin.bias is None else torch.cat([lin.bias[p] for p in parts])
            x_t = x.index_select(0, sel)[:, : layer.in_widths[t]]
            y = nn.functional.linear(x_t, weight, bias)
            at = 0
            for out, p in zip(outs, parts, strict=True):
                out.index_copy_(0, sel, y[:, at : at + p.stop - p.start])
                at += p.stop - p.start
        return outs

    @staticmethod
    def _messages(
        conv: nn.Module,
        keys: _RowMap,
        values: _RowMap,
        q: Tensor,
        relations: list[tuple[tuple[str, str, str], Tensor, Tensor]],
        rows: dict[str, Tensor],
    ) -> Tensor:
        r""":math:`m_i` (``[B, F]``) of the batch's destinations (queries ``q``), from each
        relation's ``(key, source rows, destination rows)`` (the sources' ``k`` and ``v``
        read through ``keys`` / ``values``), ``rows`` the batch rows of each destination
        type; a destination without in-edges gets 0 (``HGTConv``'s aggregation)."""
        from torch_geometric.utils import softmax

        heads, f = conv.heads, conv.out_channels
        dim = f // heads
        num_dst = q.shape[0]
        if not relations:
            return q.new_zeros(num_dst, f)  # no in-edges: HGTConv's aggregation is 0
        q = q.view(num_dst, heads, dim)
        num_rel = len(conv.edge_types)
        k_rel = conv.k_rel.weight.view(heads, num_rel, dim, dim)  # HeteroLinear type h*R + e
        v_rel = conv.v_rel.weight.view(heads, num_rel, dim, dim)
        scale = math.sqrt(dim)
        row_bytes = 3 * q.element_size() * f  # a chunk's gathered rows and their product
        scores = []
        for key, src, dst in relations:
            q_rel = torch.einsum("nhd,hcd->nhc", q, k_rel[:, conv.edge_types_map[key]])
            q_rel = q_rel.contiguous()  # gathered per edge: rows of a contiguous table
            score = q.new_empty(src.numel(), heads)
            for c in edge_chunks(src.numel(), row_bytes):
                k_j = keys(src[c]).view(-1, heads, dim)
                score[c] = (q_rel.index_select(0, dst[c]) * k_j).sum(-1)
            scores.append(score.mul_(conv.p_rel["__".join(key)] / scale))
        alpha = softmax(torch.cat(scores), torch.cat([r[2] for r in relations]), num_nodes=num_dst)
        del scores
        m = q.new_zeros(num_dst, heads, dim)
        start = 0
        for key, src, dst in relations:
            a = alpha[start : start + src.numel()]
            start += src.numel()
            agg = q.new_zeros(num_dst, heads, dim)
            for c in edge_chunks(src.numel(), row_bytes):
                v_j = values(src[c]).view(-1, heads, dim)
                agg.index_add_(0, dst[c], v_j * a[c].unsqueeze(-1))
            sel = rows[key[2]]  # only the relation's destination type has rows to map
            mapped = torch.einsum(
                "nhc,hcd->nhd", agg.index_select(0, sel), v_rel[:, conv.edge_types_map[key]]
            )
            m.index_add_(0, sel, mapped)
        return m.view(num_dst, f)
