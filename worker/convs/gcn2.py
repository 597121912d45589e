r"""Initial-residual convs (PyG ``GCN2Conv``, ``FAConv``) on a batch: GCN normalization
from whole-graph degrees, plus the model's initial representation :math:`x_0` read on the
destination rows.

.. math::
    \text{GCN2:}\quad h_v' = \big((1-\alpha)\,(\hat A x)_v + \alpha\, x_{0,v}\big)
        \big((1-\beta) I + \beta\, W\big)
    \qquad
    \text{FA:}\quad h_v' = \sum_{u \in N_{in}(v) \cup \{v\}}
        \tanh(a_l^\top x_u + a_r^\top x_v)\,\hat A_{vu}\, x_u + \epsilon\, x_{0,v}

(GCN2 with ``shared_weights=False`` projects the two terms by :math:`W_1` and :math:`W_2`.)
:math:`\hat A` is ``gcn_norm``'s (``improved=False``) with whole-graph degrees, as
:class:`~.gcn.GCNAdapter` builds it for every batch; :math:`x_0` is a per-node input the
model computes before its first conv (``ConvAdapter.node_inputs``: ``x_0`` on ``dst`` rows),
so a batch reads only its destinations' rows of it. FA's attention is per edge from the
edge's two ends, which the batch holds. Both convs' own forwards would normalize by the
batch's degrees, so the adapters compute the forward's steps themselves from the conv's
parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hopserve.worker.convs.base import LayerBatch, UnsupportedConvError
from hopserve.worker.convs.gcn import GCNAdapter

# Steps a subclass may override (``propagate`` is generated per subclass by PyG from its
# ``message`` signature, so it is not compared).
_STEPS = ("forward", "message", "aggregate", "message_and_aggregate", "update")


def check_as_written(conv, cls: type) -> None:  # noqa: ANN001 - a GCN2Conv / FAConv
    """Refuse what the adapters' own steps would get wrong: another aggregation than the
    sum, or a subclass overriding a step of the forward (it would run the base class's
    math). Raises :class:`UnsupportedConvError` naming it."""
    name = type(conv).__name__
    if conv.aggr != "add":
        reason = (
            f"{cls.__name__} with aggr={conv.aggr!r}: hopserve adapts the sum it is built "
            "with (its whole-graph normalization is recomputed per batch)"
        )
        raise UnsupportedConvError(f"{name}: {reason}", reason)
    changed = [m for m in _STEPS if getattr(type(conv), m) is not getattr(cls, m)]
    if changed:
        reason = (
            f"a subclass of {cls.__name__} overriding {', '.join(changed)}: hopserve runs "
            f"{cls.__name__}'s own steps with whole-graph degrees, not the subclass's"
        )
        raise UnsupportedConvError(f"{name}: {reason}", reason)


def _spmm(adj: Tensor, x: Tensor) -> Tensor:
    from torch_geometric.utils import spmm

    return spmm(adj, x, reduce="sum")


class _InitialResidualAdapter(GCNAdapter):
    """A ``gcn_norm``'d conv of ``(x, x_0, edge_index[, edge_weight])`` (``improved=False``)
    as its class ``library_class()`` writes it; ``x_0`` on destination rows."""

    node_inputs = {"x_0": "dst"}

    @staticmethod
    def library_class() -> type:
        raise NotImplementedError

    def __init__(self, conv) -> None:  # noqa: ANN001
        check_as_written(conv, self.library_class())
        super().__init__(conv)

    @property
    def improved(self) -> bool:
        return False  # both call gcn_norm(..., improved=False)


class GCN2Adapter(_InitialResidualAdapter):
    """``GCN2Conv(x, x_0, edge_index[, edge_weight])`` with whole-graph ``gcn_norm``."""

    @staticmethod
    def library_class() -> type:
        from torch_geometric.nn import GCN2Conv

        return GCN2Conv

    def run(self, x: Tensor, batch: LayerBatch, x_0: Tensor) -> Tensor:  # type: ignore[override]
        conv = self.conv
        h = _spmm(self._adjacency(batch, x.dtype), x)
        h.mul_(1 - conv.alpha)
        x_0 = conv.alpha * x_0
        beta = conv.beta
        if conv.weight2 is None:
            out = h.add_(x_0)
            return torch.addmm(out, out, conv.weight1, beta=1.0 - beta, alpha=beta)
        out = torch.addmm(h, h, conv.weight1, beta=1.0 - beta, alpha=beta)
        return out + torch.addmm(x_0, x_0, conv.weight2, beta=1.0 - beta, alpha=beta)


class FAAdapter(_InitialResidualAdapter):
    """``FAConv(x, x_0, edge_index[, edge_weight])``: tanh attention over ``gcn_norm``'s
    whole-graph weights (or the raw edge weights with ``normalize=False``)."""

    @staticmethod
    def library_class() -> type:
        from torch_geometric.nn import FAConv

        return FAConv

    def edge_bytes(self, src_row_bytes: int) -> int:
        return 40 + 16  # the weighted CSR, plus each edge's row id and attention

    def run(self, x: Tensor, batch: LayerBatch, x_0: Tensor) -> Tensor:  # type: ignore[override]
        conv = self.conv
        adj = self._adjacency(batch, x.dtype)
        crow, col = adj.crow_indices(), adj.col_indices()
        row = torch.repeat_interleave(torch.arange(batch.num_dst, device=crow.device), crow.diff())
        a_src = conv.att_l(x).squeeze(-1)
        a_dst = conv.att_r(batch.dst_rows(x)).squeeze(-1)
        w = adj.values() * (a_src[col] + a_dst[row]).tanh()
        attended = torch.sparse_csr_tensor(crow, col, w, size=adj.shape, check_invariants=False)
        out = _spmm(attended, x)
        return out + conv.eps * x_0 if conv.eps != 0.0 else out
