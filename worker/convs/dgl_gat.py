r"""DGL ``GATConv`` with its source side computed once per full layer.

.. math::
    h_v' = \sigma\Big(b + r(h_v) + \sum_{u \in N_{in}(v)} \alpha_{uv}\, W h_u\Big),\quad
    \alpha_{uv} = \operatorname{softmax}_{u}\big(\mathrm{LeakyReLU}(a_l^\top W h_u +
    a_r^\top W h_v)\big)

On a full layer (every node a destination, sources read in place by storage id) the
source side — the projection :math:`W h_u` and the logit :math:`e^l_u = a_l^\top W h_u`, per
head — is the same for every batch of the layer, so it is computed once per layer for all
``N`` nodes (:class:`~.layer_table.LayerTableCache`), as DGL's full-graph forward does;
each batch then takes its destinations' rows of it (:math:`e^r_v`, the residual), the
edge softmax over the block, and one SpMM per head reading the projected table in place.
These are the steps of ``GATConv.forward`` (DGL 2.1) in its order; the adapter takes this
path only for the class's own ``forward``, a shared ``fc``, in eval mode (dropout off)
and no edge data other than ``edge_weight`` — otherwise the conv's own forward runs on
gathered source rows (:class:`~.dgl_conv.DGLConvAdapter`). Partial frontiers always
gather: a few rows must not pay for the whole table.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch
from hopserve.worker.convs.dgl_conv import (
    DGLConvAdapter,
    LayerTableCache,
    _params_key,
    csr_weighted_sum,
    dgl_block,
)
from hopserve.worker.convs.layer_table import FullLayerPath, per_head_table

__all__ = ["DGLGATAdapter", "unhooked"]


@functools.cache
def _gat_forward():  # noqa: ANN202 - the class's forward, to tell overrides apart
    from dgl.nn.pytorch import GATConv

    return GATConv.forward


def unhooked(conv: nn.Module) -> bool:
    """No forward hook on ``conv`` or its submodules, nor a global one: the full-layer path
    runs the conv's steps itself, so it never calls the modules a hook would change."""
    from torch.nn.modules import module as torch_module

    if getattr(torch_module, "_global_forward_hooks", None) or getattr(
        torch_module, "_global_forward_pre_hooks", None
    ):
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in conv.modules())


class DGLGATAdapter(FullLayerPath, DGLConvAdapter):
    """``dgl.nn.GATConv`` on a batch; full layers read a once-per-layer source table."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv)
        self._source = LayerTableCache()  # (W x per head [H, N, D], e^l [N, H, 1])

    @property
    def _full_layer_path(self) -> bool:
        conv = self.conv
        return (
            type(conv).forward is _gat_forward()
            and not hasattr(conv, "fc_src")
            and not conv.training
            and {inp.param for inp in self.edge_inputs} <= {"edge_weight"}
            and unhooked(conv)
        )

    @property
    def _table_only(self) -> bool:
        return self.conv.res_fc is None

    def _table_key(self, layer: int) -> tuple:
        conv = self.conv
        return (layer, _params_key(*conv.fc.parameters(), conv.attn_l))

    def _make_table(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``W h`` per head ``[H, N, D]`` and ``e^l`` ``[N, H, 1]``."""
        conv = self.conv
        ft, el = per_head_table(
            x, conv.fc.weight, conv.fc.bias, conv.attn_l, conv._num_heads, conv._out_feats
        )
        return ft, el.transpose(0, 1).contiguous()

    def edge_bytes(self, src_row_bytes: int) -> int:
        # logits, leaky-relu'd logits, softmax per head, CSR indices/values per head
        return 24 + 16 * int(self.conv._num_heads)

    def _run_full_layer(self, x: Tensor, batch: LayerBatch) -> Tensor:
        import dgl

        conv = self.conv
        heads, width = conv._num_heads, conv._out_feats
        if not conv._allow_zero_in_degree and bool((batch.indptr.diff() == 0).any()):
            raise dgl.DGLError(
                "There are 0-in-degree nodes in the graph, output for those nodes will be "
                "invalid (GATConv with allow_zero_in_degree=False)."
            )

        key = self._table_key(batch.layer)
        ft, el = self._source.get(x, key, batch, lambda: self._make_table(x))
        a, b = batch.dst_start, batch.dst_start + batch.num_dst
        er = (ft[:, a:b].transpose(0, 1) * conv.attn_r).sum(dim=-1).unsqueeze(-1)
        dst_index = torch.repeat_interleave(
            torch.arange(batch.num_dst, device=x.device), batch.indptr.diff()
        )
        indptr, indices = batch.csc()
        e = conv.leaky_relu(el[indices] + er[dst_index])
        att = dgl.ops.edge_softmax(dgl_block(batch), e)
        if self.edge_inputs:
            w = self.edge_values(batch)["edge_weight"]
            att = att * w.tile(1, heads, 1).transpose(0, 2)
        size = (batch.num_dst, x.shape[0])
        rst = torch.stack(
            [csr_weighted_sum(indptr, indices, att[:, h, 0], ft[h], size) for h in range(heads)],
            dim=1,
        )
        if conv.res_fc is not None:
            rst = rst + conv.res_fc(x[a:b]).view(batch.num_dst, -1, width)
        if conv.has_explicit_bias:
            rst = rst + conv.bias.view(1, heads, width)
        if conv.activation:
            rst = conv.activation(rst)
        return rst
