"""Node-wise full-neighbour evaluation (DGI Algorithm 1): slow, exact, any model.

For each batch of targets, the receptive field is gathered and the model's own
``forward`` runs on that subgraph; the targets' rows are kept. With receptive field
:math:`R` hops, the subgraph holds the nodes within :math:`R` in-hops and every in-edge of
the nodes within :math:`R-1` hops. Models whose convs normalize by whole-graph degrees
(GCN, APPNP, SGConv, …) also need each in-field node's *own* degree, so for them the field
grows by one hop (nodes within :math:`R+1`, in-edges of nodes within :math:`R`): every
degree the targets' outputs read is then complete.

DGL-style models (``forward(graph, x)``) get the subgraph as a ``DGLGraph`` with one
extra *sink* node (zero features) whose output nobody reads: it sends an edge to every
node of the outer ring (so convs built with ``allow_zero_in_degree=False`` accept the
subgraph; those nodes' outputs are unused anyway), and when a conv normalizes by source
*out*-degrees (DGL ``GraphConv`` with ``norm="both"``/``"left"``) every field node gets
edges to the sink for the out-edges the subgraph lacks, so its out-degree is the whole
graph's. A graph with real zero-in-degree nodes is refused up front for such convs, as
the model's own forward would fail on it.

Edge data: a model whose ``forward`` takes ``edge_weight`` / ``edge_attr`` (DGL: ``efeat``)
gets the store's rows of the subgraph's edges (their CSC positions); the sink's edges get
weight 1 and zero features, and reach only the sink and the outer ring, whose outputs no
target reads. A graph without the column refuses the model, naming the argument.

This is the fallback for models the layer-wise engine refuses, and the node-wise
baseline of the benchmarks.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from hopserve.proto.contract import BlockInfo, LayerStats, RunStats
from hopserve.worker.convs.base import NODE_COLUMNS, fresh_conv_caches, served_edge_values
from hopserve.worker.graph.planner import LayerFrontier, Plan, plan_frontiers, segment_positions

_DEGREE_FREE = {
    "SAGEConv",
    "GraphConv",
    "GINConv",
    "GATConv",
    "GATv2Conv",
    "TransformerConv",
    "EdgeConv",
}
_HOPS_ATTR = {"APPNP": "K", "SGConv": "K", "SSGConv": "K", "TAGConv": "K", "MixHopConv": None}
# DGL's K-hop convs keep K as ``_k`` (SGConv and TAGConv share PyG's class names).
_DGL_HOPS_ATTR = {"APPNPConv": "_k", "SGConv": "_k", "TAGConv": "_k"}


def infer_hops(model: nn.Module) -> int | None:
    """Receptive field from the traced conv chain (``K`` for K-hop convs), if traceable."""
    from hopserve.worker.trace.tracer import ModelTraceError, trace_model

    try:
        traced = trace_model(model)
    except ModelTraceError:
        return None
    depth: dict = {}
    for node in traced.gm.graph.nodes:
        base = max((depth.get(i, 0) for i in node.all_input_nodes), default=0)
        hops = 0
        if node in traced.conv_nodes:
            module = traced.conv_module(node)
            attr = _HOPS_ATTR.get(type(module).__name__)
            if type(module).__module__.startswith("dgl."):
                attr = _DGL_HOPS_ATTR.get(type(module).__name__)
            hops = int(getattr(module, attr, 1)) if attr else 1
            if type(module).__name__ == "MixHopConv":
                hops = max(module.powers)
        depth[node] = base + hops
    return max(depth.values())


def needs_degree_hop(model: nn.Module) -> bool:
    """Whether any conv may read whole-graph degrees (adds one hop of field)."""
    if "torch_geometric" not in sys.modules:  # no PyG module in the model (DGL convs read
        return False  # out-degrees: see the sink)
    from torch_geometric.nn import MessagePassing

    return any(
        isinstance(m, MessagePassing) and type(m).__name__ not in _DEGREE_FREE
        for m in model.modules()
    )


def model_style(model: nn.Module) -> str:
    """``"dgl"`` for ``forward(graph, x)`` models, else ``"pyg"``."""
    from hopserve.worker.trace.tracer import ModelTraceError, _signature

    try:
        return _signature(model)[2]
    except ModelTraceError:
        return "pyg"


def reads_out_degrees(model: nn.Module) -> bool:
    """Whether a DGL module may normalize by source out-degrees (GraphConv both/left)."""
    from hopserve.worker.convs.registry import is_conv_module

    for m in model.modules():
        if not type(m).__module__.startswith("dgl.nn."):
            continue
        if getattr(m, "_norm", None) in ("both", "left"):
            return True
        if is_conv_module(m) and not hasattr(m, "_norm") and not _dgl_degree_free(m):
            return True  # an unknown DGL conv: assume the worst
    return False


def _dgl_degree_free(module: nn.Module) -> bool:
    from hopserve.worker.convs.registry import support_matrix

    return support_matrix().get(f"dgl.{type(module).__name__}", ("",))[0] == "exact"


class NodewiseEvaluator:
    """Exact node-wise evaluation over each target batch's receptive field.

    An :class:`~.factory.Evaluator` (exact evaluation only): its plans hold just the
    targets, since no frontier is run layer by layer.

    Args:
        model: any PyG-style model ``forward(x, edge_index)``.
        graph: a GraphStore.
        device: compute device.
        hops: receptive field R; inferred from the traced convs when ``None``.
        batch_size: targets per forward pass.
        degree_hop: add one hop for degree-normalized convs (``None`` = auto).
    """

    def __init__(
        self,
        model: nn.Module,
        graph,
        device: str | torch.device = "cpu",
        *,
        hops: int | None = None,
        batch_size: int = 256,
        degree_hop: bool | None = None,
    ) -> None:
        self.edge_args = _edge_args(model, graph)
        self.model = model.eval().to(device)
        self.graph = graph
        self.device = torch.device(device)
        self.hops = hops if hops is not None else infer_hops(model)
        if self.hops is None:
            raise ValueError(
                f"{type(model).__name__} cannot be traced to infer its receptive field; "
                "pass hops=R (the number of message-passing hops of the model)"
            )
        self.batch_size = batch_size
        self.style = model_style(model)
        self.degree_hop = needs_degree_hop(model) if degree_hop is None else degree_hop
        self.out_degree_sink = self.style == "dgl" and reads_out_degrees(model)
        if self.style == "dgl":
            self._check_dgl(model)
        self.last_stats: RunStats | None = None

    mode = "nodewise"
    reads_input_frontier = False  # plans carry the targets only

    @property
    def num_layers(self) -> int:
        """The receptive field in hops."""
        return int(self.hops)

    def describe(self) -> str:
        return f"node-wise fallback (receptive field {self.hops} hops)"

    def blocks(self) -> tuple[BlockInfo, ...]:
        return ()

    def plan(
        self, storage_targets: Tensor | None, fanouts: Sequence[int] | None = None, seed: int = 0
    ) -> Plan:
        """Just the targets (``None`` = all nodes); sampling is not available node-wise."""
        from hopserve.proto.contract import validate_fanouts

        if validate_fanouts(fanouts) is not None:
            raise ValueError("sampling evaluation is not available in node-wise mode")
        nodes = None if storage_targets is None else np.unique(np.asarray(storage_targets))
        return Plan([LayerFrontier(nodes)], None)

    def evaluate_plan(self, plan: Plan, storage_targets: Tensor | None) -> Tensor:
        """Rows of ``storage_targets`` (``None``: all nodes, ascending external ID)."""
        if storage_targets is None:
            storage_targets = self.graph.sorted_external_order()
        return self.evaluate_storage_ids(storage_targets)

    def close(self) -> None:
        """Nothing to release."""

    def _check_dgl(self, model: nn.Module) -> None:
        """Refusals the model's own forward would hit on this graph, up front."""
        from hopserve.worker.convs.dgl_conv import check_zero_in_degree
        from hopserve.worker.convs.registry import load_time_refusal

        refusal = load_time_refusal(model)
        if refusal is not None:
            raise ValueError(refusal)
        for name, m in model.named_modules():
            if type(m).__module__.startswith("dgl.nn."):
                check_zero_in_degree(m, self.graph, name)

    def evaluate(
        self,
        targets: Sequence[int] | Tensor | None = None,
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
    ) -> Tensor:
        """Rows for ``targets`` (external IDs, request order) or all nodes (ascending ID).

        Raises:
            ValueError: ``fanouts`` that sample (node-wise evaluation is exact only).
        """
        self.plan(None, fanouts, seed)  # refuses sampling
        g = self.graph
        if targets is None:
            order = g.sorted_external_order()
            storage = order if order is not None else torch.arange(g.num_nodes)
        else:
            storage = g.to_storage(torch.as_tensor(targets, dtype=torch.long).reshape(-1))
        return self.evaluate_storage_ids(storage)

    def evaluate_storage_ids(self, storage: Tensor) -> Tensor:
        """Rows for storage ids ``storage`` (any order, duplicates allowed), in batches."""
        t0 = time.perf_counter()
        outs = [
            self.evaluate_storage(storage[i : i + self.batch_size])
            for i in range(0, storage.numel(), self.batch_size)
        ]
        stats = RunStats(total_s=time.perf_counter() - t0, device=str(self.device))
        stats.layers.append(LayerStats(layer=0, rows=int(storage.numel()), batches=len(outs)))
        stats.compute_s = stats.total_s
        self.last_stats = stats
        return torch.cat(outs) if outs else torch.empty(0)

    def evaluate_storage(self, targets: Tensor) -> Tensor:
        """One forward over the receptive field of storage-id ``targets``."""
        g = self.graph
        depth = self.hops + (1 if self.degree_hop else 0)
        topo = g.topology
        plan = plan_frontiers(topo, np.asarray(targets), depth, None, shortcut=False)
        field_np = plan.layers[0].nodes  # within `depth` hops
        inner_np = plan.layers[1].nodes if depth >= 1 else field_np  # in-edges complete
        pos, counts = segment_positions(topo.indptr, inner_np)
        field, inner = torch.from_numpy(field_np), torch.from_numpy(inner_np)
        src = torch.searchsorted(field, torch.from_numpy(topo.indices[pos].astype(np.int64)))
        dst = torch.searchsorted(field, torch.repeat_interleave(inner, torch.from_numpy(counts)))
        x = g.features.index_select(0, field).float().to(self.device)
        edge = self._edge_data(torch.from_numpy(np.asarray(pos, dtype=np.int64)), field)
        if self.style == "dgl":
            out = self._dgl_forward(x, field, inner, src, dst, edge)
        else:
            edge_index = torch.stack([src, dst]).to(self.device)
            with torch.no_grad(), fresh_conv_caches(self.model):
                out = self.model(x, edge_index, **edge)
        return out[torch.searchsorted(field, torch.as_tensor(targets)).to(self.device)].cpu()

    def _edge_data(self, pos: Tensor, field: Tensor) -> dict[str, Tensor]:
        """The model's edge data arguments: the store's rows of the subgraph's edges
        (CSC positions ``pos``, the subgraph's edge order), and of its nodes (storage ids
        ``field``) for a node column (node type ids)."""
        return {
            arg: served_edge_values(
                column, _column_of(self.graph, column)[field if column in NODE_COLUMNS else pos]
            ).to(self.device)
            for arg, column in self.edge_args.items()
        }

    def _dgl_forward(
        self,
        x: Tensor,
        field: Tensor,
        inner: Tensor,
        src: Tensor,
        dst: Tensor,
        edge: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """The model on the field's DGLGraph plus the sink node (see the module doc)."""
        import dgl

        sink = field.numel()
        outer = torch.ones(sink, dtype=torch.bool)
        outer[torch.searchsorted(field, inner)] = False
        ring = outer.nonzero().squeeze(1)
        srcs = [src, torch.full_like(ring, sink), torch.tensor([sink])]
        dsts = [dst, ring, torch.tensor([sink])]
        if self.out_degree_sink:
            missing = self.graph.out_degrees[field] - torch.bincount(src, minlength=sink)
            owed = torch.repeat_interleave(torch.arange(sink), missing)
            srcs.append(owed)
            dsts.append(torch.full_like(owed, sink))
        graph = dgl.graph((torch.cat(srcs), torch.cat(dsts)), num_nodes=sink + 1)
        x = torch.cat([x, x.new_zeros(1, *x.shape[1:])])
        extra = graph.num_edges() - src.numel()  # the sink's edges: neutral edge data
        # The sink's edges get neutral edge data (weight 1, zero features, relation 0) and
        # the sink node type 0: they only reach the sink and the ring.
        edge = dict(edge or {})
        for arg, v in edge.items():
            column = self.edge_args[arg]
            count = 1 if column in NODE_COLUMNS else extra
            edge[arg] = torch.cat([v, _neutral_edge_rows(column, v, count)])
        with torch.no_grad():
            return self.model(graph.to(self.device), x, **edge)[:sink]


def _column_of(graph, column: str) -> Tensor:  # noqa: ANN001 - a GraphStore
    from hopserve.worker.trace.tracer import EDGE_COLUMNS

    return getattr(graph, EDGE_COLUMNS[column], None)


def _neutral_edge_rows(column: str, like: Tensor, count: int) -> Tensor:
    """``count`` rows of edge data that change nothing a sink edge reaches."""
    if column == "weight":
        return like.new_ones(count)
    return like.new_zeros(count, *like.shape[1:])


def _edge_args(model: nn.Module, graph) -> dict[str, str]:  # noqa: ANN001 - a GraphStore
    """The model's edge data arguments -> store column; refuses what cannot be served."""
    from hopserve.worker.trace.tracer import (
        ModelTraceError,
        edge_column,
        edge_data_args,
        missing_edge_data_message,
    )

    out = {}
    for arg in edge_data_args(model):
        column = edge_column(arg)
        if column is None:
            raise ModelTraceError(
                f"{type(model).__name__}.forward accepts edge data '{arg}', which hopserve "
                "cannot serve (only edge weights, edge features, edge types and node types, "
                "not edge norms)"
            )
        if _column_of(graph, column) is None:
            raise ModelTraceError(missing_edge_data_message(type(model).__name__, arg, column))
        out[arg] = column
    return out
