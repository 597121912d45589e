"""Graph store: on-disk CSC graphs with features, their ingest and synthetic generators.

Public API: :class:`GraphStore` (open / build / save / ID lookup; torch),
:class:`GraphTopology` (structure and ID map only; numpy, what the front-end opens),
:func:`ingest`, :func:`ingest_typed`, :func:`synth_powerlaw`, :func:`synth_sbm`,
:func:`synth_recommender`, :func:`synth_fraud`, :class:`GraphMeta` and the errors :class:`GraphFormatError`, :class:`IngestError`, :class:`UnknownNodeError`.
Modules, one concept each: ``format`` (layout + meta schema), ``topology``, ``store``,
``build`` (validation, CSC), ``plan`` (materialize / atomic write), ``reorder`` (RCMK),
``ids`` (external IDs), ``readers`` (input files), ``ingestion``, ``synth``, ``atomic``,
``version``, ``errors``, ``progress``; typed graphs: ``relations`` (edge types),
``node_types`` (node types as id ranges), ``ingest_typed``, ``synth_hetero``. Names are imported lazily, so the numpy-only parts
load without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.worker.graph.errors import GraphFormatError, IngestError, UnknownNodeError
    from hopserve.worker.graph.format import GraphFlags, GraphMeta
    from hopserve.worker.graph.ingest_typed import ingest_typed
    from hopserve.worker.graph.ingestion import ingest
    from hopserve.worker.graph.store import GraphStore
    from hopserve.worker.graph.synth import synth_powerlaw, synth_sbm
    from hopserve.worker.graph.synth_hetero import synth_fraud, synth_recommender
    from hopserve.worker.graph.topology import GraphTopology

_LAZY = {
    "GraphStore": "store",
    "GraphTopology": "topology",
    "GraphMeta": "format",
    "GraphFlags": "format",
    "GraphFormatError": "errors",
    "IngestError": "errors",
    "UnknownNodeError": "errors",
    "ingest": "ingestion",
    "ingest_typed": "ingest_typed",
    "synth_powerlaw": "synth",
    "synth_sbm": "synth",
    "synth_recommender": "synth_hetero",
    "synth_fraud": "synth_hetero",
}

__all__ = [
    "GraphFlags",
    "GraphFormatError",
    "GraphMeta",
    "GraphStore",
    "GraphTopology",
    "IngestError",
    "UnknownNodeError",
    "ingest",
    "ingest_typed",
    "synth_fraud",
    "synth_powerlaw",
    "synth_recommender",
    "synth_sbm",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
