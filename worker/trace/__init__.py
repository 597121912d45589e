"""Tracer and splitter: the user's unmodified model → per-layer ConvBlocks (DGI §3.1–3.2)."""

from hopserve.worker.trace.blocks import ConvBlock, ModelSplit
from hopserve.worker.trace.probe import FeatureWidthError
from hopserve.worker.trace.split import split_model
from hopserve.worker.trace.tracer import ModelTraceError, TracedModel, trace_model

__all__ = [
    "ConvBlock",
    "FeatureWidthError",
    "ModelSplit",
    "ModelTraceError",
    "TracedModel",
    "split_model",
    "trace_model",
]
