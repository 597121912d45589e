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
from hopserve.worker.trace.tracer import ModelTraceError

__all__ = ["check_split"]

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
    from hopserve.worker.graph.store import GraphStore
    from hopserve.worker.trace.probe import (
        call_model,
        probe_edge_data,
        probe_edge_index,
        typed_probe_columns,
    )

    ei, n = probe_edge_index(model, split.style)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(n, feature_dim, generator=gen)
    # Edge data arguments get random columns of the right width, stored in CSC order.
    edge = probe_edge_data(
        split.edge_args,
        ei,
        split.edge_feature_dim,
        seed=13,
        num_relations=split.num_relations,
        num_nodes=n,
        num_node_types=split.num_node_types,
    )
    keyword = {"weight": "edge_weight", "features": "edge_attr", "type": "edge_type"}
    columns: dict = {}
    node_type = None
    for arg, column in split.edge_args.items():
        if column == "node_type":
            node_type = edge[arg]
        else:
            columns[keyword[column]] = edge[arg]
    if node_type is not None:  # a typed probe store: the probe's type runs
        columns |= typed_probe_columns(
            node_type, columns.get("edge_type"), ei.shape[1], feature_dim
        )
    probe = GraphStore.from_edge_index(ei, x, reorder=None, **columns)
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
        if got.shape != want.shape or not _close(got, want):
            err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
            raise ModelTraceError(
                "layer-wise evaluation differs from the model's own forward on a probe "
                f"graph (max abs error {err}); an op outside the convs likely mixes "
                "nodes (e.g. a reduction or softmax over dim 0, graph-level "
                f"normalization). {NODEWISE_ADVICE}. Schema:\n{split.describe()}"
            )


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to float32 rounding of the result's magnitude: per element
    ``|got - want| <= 1e-3·|want| + max(1e-4, ULPS·ε·max|want|)``."""
    g, w = got.double(), want.double()
    scale = float(w.abs().max()) if w.numel() else 0.0
    eps = torch.finfo(torch.float32).eps
    tol = 1e-3 * w.abs() + max(1e-4, ULPS * eps * scale)
    return bool(((g - w).abs() <= tol).all())
