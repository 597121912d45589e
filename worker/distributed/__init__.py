"""All-node embedding as an offline job, on one process or many (``hopserve embed-all``).

The graph is partitioned 1-D over ranks: each rank owns a contiguous range of storage ids
(the RCMK order keeps most in-edges inside a range), computes every layer for its range
with the engine's ConvBlocks, and before each layer receives only the *halo* rows it
reads from other ranks (DEAL's 1-D SPMM: send the needed ids once, then the rows each
layer). Modules, one concept each: ``partition`` (ranges balanced by edges), ``halo``
(who needs which rows, computed once), ``exchange`` (the process group and
``all_to_all``), ``checkpoint`` (per-layer outputs, resumable), ``output`` (Parquet
shards), ``job`` (the per-layer loop).

Names are imported lazily, so ``partition`` and ``halo`` load without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.worker.distributed.checkpoint import CheckpointMismatchError
    from hopserve.worker.distributed.job import EmbedAllResult, JobIdentity, embed_all
    from hopserve.worker.distributed.partition import Partition, partition_by_edges

_LAZY = {
    "CheckpointMismatchError": "checkpoint",
    "EmbedAllResult": "job",
    "JobIdentity": "job",
    "embed_all": "job",
    "Partition": "partition",
    "partition_by_edges": "partition",
}

__all__ = [
    "CheckpointMismatchError",
    "EmbedAllResult",
    "JobIdentity",
    "Partition",
    "embed_all",
    "partition_by_edges",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
