r"""PyG ``GATConv`` with its source side computed once per full layer.

.. math::
    h_v' = b + r(x_v) + \Big\Vert_{h} \sum_{u \in N_{in}(v) \cup \{v\}} \alpha^h_{uv}\,
    \Theta^h x_u,\quad
    \alpha^h_{uv} = \operatorname{softmax}_{u}\big(\mathrm{LeakyReLU}(a^{h\top}_{src}
    \Theta^h x_u + a^{h\top}_{dst} \Theta^h_{dst} x_v)\big)

(``concat=False`` averages the heads instead of concatenating them; with
``add_self_loops`` the destination's own self-loops are replaced by one.)

On a full layer (every node a destination, sources read in place by storage id) the
source side — the projection :math:`\Theta^h x_u` and its logit :math:`a^{h\top}_{src}
\Theta^h x_u`, per head — is the same for every batch of the layer, so it is computed once
per layer for all ``N`` rows (:class:`~.layer_table.LayerTableCache`), as the model's
whole-graph forward does; each batch then takes its destinations' rows of it, the
softmax over each destination's in-edges and its one self-loop, and one SpMM per head
reading the projected table in place. Otherwise the conv's own forward runs on the
batch's gathered rows (:class:`~.message_passing.MessagePassingAdapter`), which is how a
partial frontier always runs: a few rows must not pay for the whole table.

These are the steps of ``GATConv.forward`` (PyG 2.8) in its order; the path is taken only
for the class's own ``forward``/``message``/``edge_update``/``aggregate``/``update`` with
its sum aggregation and no hooks, in eval mode (or without dropout) and without edge
features.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch
from hopserve.worker.convs.layer_table import (
    FullLayerPath,
    LayerTableCache,
    csr_weighted_sum,
    per_head_table,
)
from hopserve.worker.convs.message_passing import MessagePassingAdapter

__all__ = ["GATAdapter"]


def _plain_gat(conv: nn.Module) -> bool:
    from torch_geometric.nn import GATConv

    cls = type(conv)
    hooks = (
        "_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
        "_message_forward_hooks", "_edge_update_forward_pre_hooks", "_edge_update_forward_hooks",
        "_forward_pre_hooks", "_forward_hooks",
    )  # fmt: skip
    return (
        all(
            getattr(cls, name, None) is getattr(GATConv, name, None)
            for name in ("forward", "message", "edge_update", "aggregate", "update")
        )
        and conv.aggr in ("add", "sum")  # GATConv(aggr="mean"/"max") runs its own forward
        and not any(getattr(conv, h, None) for h in hooks)
    )


class GATAdapter(FullLayerPath, MessagePassingAdapter):
    """``torch_geometric.nn.GATConv`` on a batch; full layers read a once-per-layer
    source table (see the module doc)."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv, pair=True)
        self._source = LayerTableCache()  # (Θ x per head [H, N, C], source logits [N, H])

    @property
    def _full_layer_path(self) -> bool:
        conv = self.conv
        return (
            _plain_gat(conv)
            and (not conv.training or conv.dropout == 0.0)
            and not self.edge_inputs
            and not conv.explain  # explainers read the attention PyG's propagate stores
        )

    def edge_bytes(self, src_row_bytes: int) -> int:
        if not self._full_layer_path:
            return super().edge_bytes(src_row_bytes)
        # destination index, loop mask; logits, exponentials, weights and one CSR value
        # per head
        return 9 + 16 * int(self.conv.heads)

    def _lins(self) -> tuple[nn.Module, nn.Module]:
        """The source and destination projections (PyG >= 2.6 shares one ``lin``; 2.5
        shares ``lin_src`` as ``lin_dst``)."""
        conv = self.conv
        shared = getattr(conv, "lin", None)
        if shared is not None:
            return shared, shared
        return conv.lin_src, conv.lin_dst

    @property
    def _table_only(self) -> bool:
        lin_src, lin_dst = self._lins()
        return lin_dst is lin_src and getattr(self.conv, "res", None) is None

    def _table_key(self, layer: int) -> tuple:
        params = (*self._lins()[0].parameters(), self.conv.att_src)
        return (layer, *((id(p), p._version) for p in params))

    def _make_table(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``Θ^h x`` per head ``[H, N, C]`` and the source logits ``[N, H]``."""
        conv, lin_src = self.conv, self._lins()[0]
        table, logit = per_head_table(
            x, lin_src.weight, lin_src.bias, conv.att_src, conv.heads, conv.out_channels
        )
        return table, logit.squeeze(2).t().contiguous()

    def _run_full_layer(self, x: Tensor, batch: LayerBatch) -> Tensor:
        conv = self.conv
        heads, width = conv.heads, conv.out_channels
        lin_src, lin_dst = self._lins()
        key = self._table_key(batch.layer)
        table, src_logit = self._source.get(x, key, batch, lambda: self._make_table(x))

        a, b = batch.dst_start, batch.dst_start + batch.num_dst
        x_dst = batch.dst_rows(x)
        if lin_dst is lin_src:
            proj_dst = table[:, a:b].transpose(0, 1)  # [B, H, C]
        else:
            proj_dst = lin_dst(x_dst).view(-1, heads, width)
        dst_logit = (proj_dst * conv.att_dst).sum(dim=-1)  # [B, H]

        src, dst = batch.src_index, batch.dst_index
        edge = nn.functional.leaky_relu(
            src_logit.index_select(0, src) + dst_logit.index_select(0, dst), conv.negative_slope
        )
        if conv.add_self_loops:  # the destination's own loops give way to one new loop
            edge = edge.masked_fill((src == dst + a).unsqueeze(1), float("-inf"))
            loop = nn.functional.leaky_relu(src_logit[a:b] + dst_logit, conv.negative_slope)
            peak = loop.clone()
        else:
            loop = None
            peak = torch.full_like(dst_logit, float("-inf"))
        # softmax over each destination's in-edges (and loop), as PyG's softmax computes it
        index = dst.unsqueeze(1).expand_as(edge)
        peak.scatter_reduce_(0, index, edge, "amax", include_self=True)
        edge = (edge - peak.index_select(0, dst)).exp()
        total = torch.zeros_like(dst_logit).index_add_(0, dst, edge)
        if loop is not None:
            loop = (loop - peak).exp()
            total += loop
        total += 1e-16
        edge /= total.index_select(0, dst)

        size = (batch.num_dst, x.shape[0])
        heads_out = []
        for h in range(heads):
            out_h = csr_weighted_sum(batch.indptr, src, edge[:, h], table[h], size)
            if loop is not None:
                out_h += (loop[:, h] / total[:, h]).unsqueeze(1) * table[h, a:b]
            heads_out.append(out_h)
        out = torch.stack(heads_out, dim=1)  # [B, H, C]
        out = out.reshape(batch.num_dst, heads * width) if conv.concat else out.mean(dim=1)
        res = getattr(conv, "res", None)  # PyG >= 2.6
        if res is not None:
            out = out + res(x_dst)
        if conv.bias is not None:
            out = out + conv.bias
        return out
