"""Dict models (``forward(x_dict, edge_index_dict)``) on typed stores.

:func:`homogenize` rebuilds such a model over the store's homogeneous form
(:class:`TypeLayout`: node types as storage-id ranges, relations as ``edge_type`` ids), so
the engine traces, splits and serves it as any model; :mod:`.modules` holds the typed
modules it is made of.
"""

from hopserve.worker.hetero.homogenize import (
    HomogeneousModel,
    as_homogeneous,
    homogenize,
    is_dict_model,
)
from hopserve.worker.hetero.layout import TypeLayout

__all__ = ["HomogeneousModel", "TypeLayout", "as_homogeneous", "homogenize", "is_dict_model"]
