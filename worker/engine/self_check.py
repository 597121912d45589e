"""The load-time self-check: layer-wise results vs the model's own forward on a probe graph.

A model whose ops outside the convs mix nodes (a reduction or softmax over dim 0, a
graph-level normalization) traces and splits fine but is not node-wise, so layer-wise
evaluation would be silently wrong. Before serving, the split runs on a small random
probe graph with tiny fixed batches (so an op that mixes nodes across a batch shows up),
for all nodes and for a partial target set with a duplicate, and must equal the model's
own full-graph forward within float32 rounding. The check runs in its own
:class:`~.run.RunContext`; the evaluator's graph and batch sizers are never touched.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from hopserve.proto.contract import RunStats
from hopserve.worker.convs.base import fresh_conv_caches
from hopserve.worker.convs.registry import NODEWISE_ADVICE
from hopserve.worker.engine.batching import BatchSizer
from hopserve.worker.engine.run import RunContext, evaluate_plan
from hopserve.worker.graph.planner import LayerFrontier, Plan, plan_frontiers
from hopserve.worker.hetero.layout import probe_type_ranges
from hopserve.worker.trace.tracer import ModelTraceError

__all__ = ["check_split", "matches_forward"]

PROBE_BATCH_NODES = 6  # small fixed batches: nodes of a probe batch see few others
ULPS = 64  # float32 rounding allowance, in ulps of the largest output (as tests' assert_exact)


def check_split(model, split, ctx: RunContext, feature_dim: int, reads_v0: bool) -> None:  # noqa: ANN001
    """Raise :class:`ModelTraceError` (with the schema) if layer-wise != the model's forward.

    Args:
        model: The user's model (on ``ctx.device``).
        split: Its :class:`~hopserve.worker.trace.blocks.ModelSplit`.
        ctx: The evaluator's context; only its device, budgets and copy stream are used.
        feature_dim: Width of the probe features.
        reads_v0: Whether plans annotate ``V^0`` (a node-wise block 0).
    """
    from hopserve.worker.trace.probe import probe_store

    probe_graph = probe_store(
        model,
        split.style,
        split.edge_args,
        feature_dim,
        edge_feature_dim=split.edge_feature_dim,
        num_relations=split.num_relations,
        num_node_types=split.num_node_types,
    )
    with probe_type_ranges(model, probe_graph.x.shape[0]):
        _check_on_probe(model, split, ctx, probe_graph, reads_v0)


def _check_on_probe(model, split, ctx: RunContext, probe_graph, reads_v0: bool) -> None:  # noqa: ANN001
    """:func:`check_split` on ``probe_graph`` (a :class:`~hopserve.worker.trace.probe.ProbeGraph`)."""
    from hopserve.worker.trace.probe import call_model

    x, ei, edge, probe = probe_graph.x, probe_graph.edge_index, probe_graph.edge, probe_graph.store
    n = x.shape[0]
    dev = ctx.device
    with torch.no_grad(), fresh_conv_caches(model):
        edge_dev = {k: v.to(dev) for k, v in edge.items()}
        expected = call_model(model, split.style, x.to(dev), ei.to(dev), edge_dev).cpu()
    sizers: dict[int, BatchSizer] = {}

    def tiny_sizer(block, target_bytes: float) -> BatchSizer:  # noqa: ANN001 - ConvBlock
        return sizers.setdefault(
            block.index,
            BatchSizer(
                target_bytes,
                max_nodes=PROBE_BATCH_NODES,
                max_edges=PROBE_BATCH_NODES * max(1.0, probe.avg_degree),
                max_growth=1.0,
            ),
        )

    # The evaluator's context on the probe graph: tiny batches, no prefetch, no bars.
    probe_ctx = dataclasses.replace(
        ctx, graph=probe, split=split, sizer_for=tiny_sizer, pool=None, progress=False
    )
    targets = torch.tensor([n - 1, 0, 5, 5, n // 2])
    full = Plan([LayerFrontier(None)] * (split.num_layers + 1), None)
    partial = plan_frontiers(
        probe.topology, targets.numpy(), split.num_layers, input_layer=reads_v0
    )
    got_all = evaluate_plan(probe_ctx, full, None, RunStats(), time.perf_counter())
    got_part = evaluate_plan(probe_ctx, partial, targets, RunStats(), time.perf_counter())
    for got, want in ((got_all, expected), (got_part, expected[targets])):
        if got.shape != want.shape or not matches_forward(got, want):
            err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
            raise ModelTraceError(
                "layer-wise evaluation differs from the model's own forward on a probe "
                f"graph (max abs error {err}); {_likely_cause(model)}. "
                f"Schema:\n{split.describe()}"
            )


def _likely_cause(model) -> str:  # noqa: ANN001
    """What a self-check failure most likely means, and what to do about it."""
    if getattr(model, "layout", None) is not None:  # a dict model: no node-wise fallback
        return (
            "a relation conv whose result depends on the order of its messages (e.g. "
            "SAGEConv's LSTM aggregator) or an op mixing nodes (a reduction or softmax over "
            "dim 0) is not exact layer by layer, and dict models have no node-wise "
            "fallback: replace that relation conv or op"
        )
    return (
        "an op outside the convs likely mixes nodes (e.g. a reduction or softmax over dim "
        f"0, graph-level normalization). {NODEWISE_ADVICE}"
    )


def matches_forward(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-3) -> bool:
    """Equal up to float32 rounding of the result's magnitude: per element
    ``|got - want| <= rtol·|want| + max(rtol / 10, ULPS·ε·max|want|)``."""
    g, w = got.double(), want.double()
    scale = float(w.abs().max()) if w.numel() else 0.0
    eps = torch.finfo(torch.float32).eps
    tol = rtol * w.abs() + max(rtol / 10, ULPS * eps * scale)
    return bool(((g - w).abs() <= tol).all())
