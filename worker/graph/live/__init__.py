"""A graph that takes updates: mutation batches, the update log, snapshots, invalidation."""

from hopserve.worker.graph.live.graph import (
    ApplyResult,
    GraphSeqError,
    LiveGraph,
    ModelKind,
    forget_live,
    open_live,
)
from hopserve.worker.graph.live.invalidation import affected_nodes
from hopserve.worker.graph.live.mutations import InvalidUpdateError, MutationBatch

__all__ = [
    "ApplyResult",
    "GraphSeqError",
    "InvalidUpdateError",
    "LiveGraph",
    "ModelKind",
    "MutationBatch",
    "affected_nodes",
    "forget_live",
    "open_live",
]
