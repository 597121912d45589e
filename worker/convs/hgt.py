r"""PyG ``HGTConv`` on a batch with no per-source projection: the projections run on the
destination side.

For an edge :math:`j \to i` of relation :math:`r = (s, \cdot, t)`, head :math:`h`
(:math:`D = F / H`), ``HGTConv`` computes, with ``kqv_lin``'s per-type maps
:math:`k_j = K_s x_j + c_s`, :math:`v_j = V_s x_j + e_s`, :math:`q_i = Q_t x_i + f_t`
(head :math:`h`'s rows of each):

.. math::
    \sigma_{ij} = \frac{(q_i \cdot k_j W^k_{h,r})\, p_{r,h}}{\sqrt D}, \quad
    \alpha_{ij} = \operatorname{softmax}_{j \in N_{in}(i)} \sigma_{ij}, \quad
    m_i = \sum_j \alpha_{ij}\, v_j W^v_{h,r}

(the softmax runs over all of ``i``'s in-edges, across relations). Both are linear in
:math:`x_j`, so with :math:`\tilde q_{ir} = W^k_{h,r} q_i`:

.. math::
    \sigma_{ij} = \frac{(u_{ir} \cdot x_j + \beta_{ir})\, p_{r,h}}{\sqrt D}, \quad
    u_{ir} = K_s^\top \tilde q_{ir}, \quad \beta_{ir} = c_s \cdot \tilde q_{ir}, \qquad
    m_i = \sum_r \big(V_s A_{ir} + e_s S_{ir}\big) W^v_{h,r}, \quad
    A_{ir} = \sum_{j \in N_r(i)} \alpha_{ij} x_j, \quad S_{ir} = \sum_{j \in N_r(i)} \alpha_{ij}

The same function, summed in another order. A batch projects its destinations only
(:math:`u`, :math:`\beta` and the final maps), and reads each source row once per in-edge;
the generic path (:class:`~.hetero.DictConvAdapter`, the conv on the batch's typed
subgraph) projects every source of every batch, about seven times per node and layer on
a power-law graph. Nothing is derived from the whole table, so every layer reads the
stored table in place. Then, as ``HGTConv`` does,
:math:`\mathrm{out}_i = \mathrm{out\_lin}_t(\mathrm{gelu}(m_i))`, mixed with :math:`x_i`
by the type's learned skip gate when the widths agree.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import LayerBatch
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


class HGTAdapter(DictConvAdapter):
    """Runs a :class:`DictConvLayer` over PyG ``HGTConv`` on a batch (see the module doc)."""

    def edge_bytes(self, src_row_bytes: int) -> int:
        """Per in-edge: the gathered source row, one head's gathered ``u`` row, their
        product and the weighted row (four input-wide rows); the scores are ``O(H)``."""
        return 4 * src_row_bytes

    @property
    def supports_global_src(self) -> bool:
        return True  # reads source rows by index, derives nothing from the whole table

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        layer: DictConvLayer = self.conv
        conv = layer.conv
        layout = layer.layout
        device = x.device
        num_dst = batch.num_dst
        x_dst = batch.dst_rows(x)
        src, dst = batch.src_index, batch.dst_index
        src_ids = src if batch.global_src_size is not None else batch.src_nodes[src]
        src_types = layout.types_of(src_ids, 0, device)
        dst_types = layout.types_of(batch.dst_nodes, num_dst, device)
        edge_type = self.edge_values(batch)["edge_type"]
        out = x.new_zeros((num_dst, *layer.out_shape))
        index = layout.names.index
        outputs = {index(k[2]) for k in conv.edge_types} & set(layer.in_widths)
        for t in sorted(outputs):
            dst_sel = (dst_types == t).nonzero().squeeze(1)
            if dst_sel.numel() == 0:
                continue
            pos_in_t = torch.full((num_dst,), -1, dtype=torch.long, device=device)
            pos_in_t[dst_sel] = torch.arange(dst_sel.numel(), device=device)
            x_t = x_dst.index_select(0, dst_sel)[:, : layer.in_widths[t]]
            at_t = pos_in_t[dst]
            relations = []
            for rel, key in layer.relations:
                if index(key[2]) != t:
                    continue
                s = index(key[0])
                # A typed store's relation-r edges all run s -> t; the load-time probe
                # graph's need not, and HGTConv's forward ignores the others.
                on = ((edge_type == rel) & (at_t >= 0) & (src_types == s)).nonzero().squeeze(1)
                relations.append((key, src.index_select(0, on), at_t.index_select(0, on)))
            m = self._messages(conv, x, x_t, layout.names[t], relations)
            y = conv.out_lin.lins[layout.names[t]](nn.functional.gelu(m))
            if y.shape[-1] == x_t.shape[-1]:
                gate = conv.skip[layout.names[t]].sigmoid()
                y = gate * y + (1 - gate) * x_t
            out[dst_sel, : y.shape[1]] = y
        return out

    @staticmethod
    def _messages(
        conv: nn.Module,
        x: Tensor,
        x_t: Tensor,
        t_name: str,
        relations: list[tuple[tuple[str, str, str], Tensor, Tensor]],
    ) -> Tensor:
        r""":math:`m_i` (``[n_t, F]``) for the destinations ``x_t`` of type ``t_name``, from
        each relation's ``(key, source rows in x, destination positions in x_t)``."""
        from torch_geometric.utils import softmax

        heads, f = conv.heads, conv.out_channels
        dim = f // heads
        n_t = x_t.shape[0]
        if not relations:
            return x_t.new_zeros(n_t, f)  # no in-edges: HGTConv's aggregation is 0
        lin_t = conv.kqv_lin.lins[t_name]
        q_b = None if lin_t.bias is None else lin_t.bias[f : 2 * f]
        q = nn.functional.linear(x_t, lin_t.weight[f : 2 * f], q_b).view(n_t, heads, dim)
        num_rel = len(conv.edge_types)
        k_rel = conv.k_rel.weight.view(heads, num_rel, dim, dim)  # HeteroLinear type h*R + e
        v_rel = conv.v_rel.weight.view(heads, num_rel, dim, dim)
        scores, parts = [], []
        for key, src, dst in relations:
            lin_s = conv.kqv_lin.lins[key[0]]
            width = int(lin_s.weight.shape[1])
            e = conv.edge_types_map[key]
            q_rel = torch.einsum("nhd,hcd->nhc", q, k_rel[:, e])  # W^k q_i, per head
            u = torch.einsum("nhc,hci->nhi", q_rel, lin_s.weight[:f].view(heads, dim, width))
            x_j = x.index_select(0, src)[:, :width]
            score = torch.stack(
                [(u[:, h].index_select(0, dst) * x_j).sum(-1) for h in range(heads)], 1
            )
            if lin_s.bias is not None:
                beta = torch.einsum("nhc,hc->nh", q_rel, lin_s.bias[:f].view(heads, dim))
                score = score + beta.index_select(0, dst)
            scores.append(score * conv.p_rel["__".join(key)] / math.sqrt(dim))
            parts.append((lin_s, e, width, x_j, dst))
        alpha = softmax(torch.cat(scores), torch.cat([p[4] for p in parts]), num_nodes=n_t)
        out = [x_t.new_zeros(n_t, dim) for _ in range(heads)]
        start = 0
        for lin_s, e, width, x_j, dst in parts:
            a = alpha[start : start + dst.numel()]
            start += dst.numel()
            v_w = lin_s.weight[2 * f :].view(heads, dim, width)
            v_b = None if lin_s.bias is None else lin_s.bias[2 * f :].view(heads, dim)
            for h in range(heads):
                agg = x_t.new_zeros(n_t, width).index_add_(0, dst, a[:, h : h + 1] * x_j)
                v = agg @ v_w[h].T
                if v_b is not None:
                    mass = x_t.new_zeros(n_t).index_add_(0, dst, a[:, h])
                    v = v + mass[:, None] * v_b[h]
                out[h] = out[h] + v @ v_rel[h, e]
        return torch.cat(out, 1)
