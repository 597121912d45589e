"""``AntiSymmetricConv`` (A-DGN) on a batch: its inner conv ``phi`` through phi's own adapter.

.. math::
    h_v' = h_v + \\epsilon\\, \\sigma\\big((W - W^\\top - \\gamma I)\\, h_v
           + \\Phi(h, N_{in}(v)) + b\\big)

repeated ``num_iters`` times, where :math:`\\Phi` is the inner conv ``phi`` (by default a
``GCNConv``).

Exactness: with ``num_iters=1`` the module is one hop: everything but :math:`\\Phi` is
node-wise on the destination's own row, and :math:`\\Phi` is a conv, run exactly on the
batch by the adapter the support matrix gives it (``GCNConv``'s whole-graph degrees
included, see :mod:`.gcn`). The conv's own forward runs on the destination rows, with
``phi`` replaced, for that call only, by a module returning phi's adapter output for the
batch; the user's module is not mutated. ``num_iters > 1`` chains ``phi`` (that many hops
inside one module) and is refused, as is a ``phi`` the matrix refuses.
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch, UnsupportedConvError


class _BatchResult(nn.Module):
    """Stands in for ``phi`` during one call: returns the adapter's result for the batch."""

    def __init__(self, result: Tensor) -> None:
        super().__init__()
        self.result = result

    def forward(self, *args: object, **kwargs: object) -> Tensor:
        return self.result


class AntiSymmetricAdapter(ConvAdapter):
    """Runs ``AntiSymmetricConv(num_iters=1)`` exactly, ``phi`` through its own adapter."""

    def __init__(self, conv: nn.Module) -> None:
        from hopserve.worker.convs.registry import adapter_for

        if conv.num_iters != 1:
            raise UnsupportedConvError(
                f"num_iters={conv.num_iters} runs its inner conv that many hops inside one module"
            )
        try:
            phi = adapter_for(conv.phi, "phi")
        except UnsupportedConvError as err:
            raise UnsupportedConvError(f"its inner conv phi: {err.reason}") from err
        super().__init__(conv)
        self.phi = phi

    @property
    def qualname(self) -> str:
        return getattr(self.phi, "qualname", "")

    @qualname.setter
    def qualname(self, name: str) -> None:
        if hasattr(self.phi, "qualname"):
            self.phi.qualname = f"{name}.phi"

    def prepare(self, graph) -> None:  # graph: GraphStore
        self.bind_edge_data(graph)
        self.phi.prepare(graph)

    def edge_bytes(self, src_row_bytes: int) -> int:
        return self.phi.edge_bytes(src_row_bytes)

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        view = copy.copy(self.conv)  # a new __dict__ and module dict; parameters shared
        view.__dict__["_modules"] = {**self.conv._modules, "phi": _BatchResult(self.phi(x, batch))}
        return view(batch.dst_rows(x), batch.edge_index)
