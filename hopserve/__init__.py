"""hopserve: exact GNN node embeddings, computed layer by layer and served over gRPC.

The heavy engine classes are exported lazily so that ``import hopserve.client`` works in
an environment with only grpcio, protobuf and numpy (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "GraphStore": "hopserve.worker.graph.store",
    "GraphTopology": "hopserve.worker.graph.topology",
    "LayerwiseEvaluator": "hopserve.worker.engine.evaluator",
    "NodewiseEvaluator": "hopserve.worker.engine.nodewise",
    "make_evaluator": "hopserve.worker.engine.factory",
    "register_conv": "hopserve.worker.convs.registry",
}

__all__ = [
    "GraphStore",
    "GraphTopology",
    "LayerwiseEvaluator",
    "NodewiseEvaluator",
    "__version__",
    "make_evaluator",
    "register_conv",
]

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.worker.convs.registry import register_conv
    from hopserve.worker.engine.evaluator import LayerwiseEvaluator
    from hopserve.worker.engine.factory import make_evaluator
    from hopserve.worker.engine.nodewise import NodewiseEvaluator
    from hopserve.worker.graph.store import GraphStore
    from hopserve.worker.graph.topology import GraphTopology


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hopserve' has no attribute {name!r}")
