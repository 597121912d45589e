"""Choose the evaluator for a model: layer-wise, or the exact node-wise fallback.

Both implement :class:`Evaluator`, the interface the worker and the library use, so the
rest of the system never branches on a mode flag.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal, Protocol

import torch
from torch import Tensor, nn

from hopserve.proto.contract import BlockInfo, RunStats
from hopserve.worker.graph.planner import Plan

__all__ = ["Evaluator", "make_evaluator"]

log = logging.getLogger(__name__)

Fallback = Literal["error", "nodewise"]


class Evaluator(Protocol):
    """What the worker and the library need of an evaluator."""

    model: nn.Module
    graph: object  # GraphStore
    device: torch.device
    mode: str  # "layerwise" | "nodewise"
    last_stats: RunStats | None

    @property
    def num_layers(self) -> int:
        """Layers L (the length of a request's fanouts; hops for the node-wise fallback)."""
        ...

    @property
    def reads_input_frontier(self) -> bool:
        """Whether plans need ``V^0``."""
        ...

    def describe(self) -> str: ...

    def blocks(self) -> tuple[BlockInfo, ...]: ...

    def plan(
        self, storage_targets: Tensor | None, fanouts: Sequence[int] | None = None, seed: int = 0
    ) -> Plan: ...

    def evaluate(
        self,
        targets: Sequence[int] | Tensor | None = None,
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
    ) -> Tensor: ...

    def evaluate_plan(self, plan: Plan, storage_targets: Tensor | None) -> Tensor: ...

    def close(self) -> None: ...


def make_evaluator(
    model: nn.Module,
    graph,
    device: str | torch.device = "cpu",
    *,
    fallback: Fallback = "error",
    hops: int | None = None,
    **settings,
) -> Evaluator:
    """The layer-wise evaluator, or, when the model cannot be split and ``fallback`` is
    ``"nodewise"``, the exact node-wise one.

    Args:
        model: The user's model.
        graph: Its :class:`~hopserve.worker.graph.GraphStore`.
        device: Compute device.
        fallback: ``"error"`` refuses models that cannot be split (the error says why);
            ``"nodewise"`` serves them node by node over their receptive field.
        hops: The node-wise receptive field when it cannot be inferred.
        **settings: :class:`~.evaluator.LayerwiseEvaluator` keyword arguments.

    Raises:
        ModelTraceError: the model cannot be split and ``fallback`` is ``"error"``; a
            :class:`~hopserve.worker.trace.probe.FeatureWidthError` always (a wrong
            config is not a reason to fall back).
        ValueError: an unknown ``fallback``.
    """
    from hopserve.worker.engine.evaluator import LayerwiseEvaluator
    from hopserve.worker.trace.probe import FeatureWidthError
    from hopserve.worker.trace.tracer import ModelTraceError

    if fallback not in ("error", "nodewise"):
        raise ValueError(f"fallback must be 'error' or 'nodewise', got {fallback!r}")
    try:
        return LayerwiseEvaluator(model, graph, device, **settings)
    except ModelTraceError as err:
        if fallback == "error" or isinstance(err, FeatureWidthError):
            raise
        from hopserve.worker.engine.nodewise import NodewiseEvaluator

        log.warning("layer-wise split refused (%s); serving node-wise (exact, slow)", err)
        return NodewiseEvaluator(model, graph, device, hops=hops)
