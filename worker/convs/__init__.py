"""Conv adapters: how each supported conv runs exactly on one batch (the bipartite graph of its destinations and their in-neighbours).

The support matrix lives in :mod:`hopserve.worker.convs.registry` (rows in
:mod:`~.pyg_support` and :mod:`~.dgl_support`); ``docs/support_matrix.md`` lists every
conv PyG and DGL export as exact, adapted or refused, and why.
"""

from hopserve.worker.convs.base import ConvAdapter, LayerBatch, UnsupportedConvError
from hopserve.worker.convs.registry import adapter_for, register_conv, support_matrix

__all__ = [
    "LayerBatch",
    "ConvAdapter",
    "UnsupportedConvError",
    "adapter_for",
    "register_conv",
    "support_matrix",
]
