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

Both ways: a model whose rows read out-neighbours too (``DirGNNConv``, a ``forward`` that
flips or symmetrizes ``edge_index``) gets its field over in- *and* out-edges: the nodes
within :math:`R` hops either way, and every in- and out-edge of the nodes within
:math:`R-1`.

Checked at load (:meth:`NodewiseEvaluator.check_field`): on a sparse probe graph, the
node-wise rows of every node, a few targets a forward, must equal the model's own
full-graph forward, with the field over in-edges or else both ways. A model whose rows
depend on nodes outside any :math:`R`-hop field (a graph-level normalization such as
``GraphNorm``, global attention or pooling, ``WLConv``'s colouring, a receptive field
larger than the ``hops`` given) is refused with the error, never served inexactly.

Many targets: when the batches' fields together would cover the graph at least twice over
(deep or dense fields), and the whole graph is at most :data:`WHOLE_GRAPH_MEMORY` times a
batch's field, the model's own forward runs on the whole graph once (exact by definition)
and the targets' rows are taken from it.

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
from hopserve.worker.graph.planner import (
    LayerFrontier,
    Plan,
    field_edges,
    receptive_field,
)

PROBE_NODES = 150  # the field check's probe graph: at least this many nodes, and enough
PROBE_DEGREE = 2  # that a batch's field (a local graph: O(hops) nodes) is a small part
PROBE_BATCH = 3  # targets a probe forward
PROBE_RTOL = 1e-4  # the tests' tolerance: a field one hop short is off by more
WHOLE_GRAPH_MEMORY = 4
"""The whole graph (nodes + edges) may hold this many times a batch's field for the
node-wise fallback to run the model's forward on it once instead of the batches."""

_DEGREE_FREE = {
    "SAGEConv",
    "GraphConv",
    "GINConv",
    "GATConv",
    "GATv2Conv",
    "TransformerConv",
    "EdgeConv",
}
_HOPS = {
    "torch_geometric:APPNP": lambda m: m.K,
    "torch_geometric:SGConv": lambda m: m.K,
    "torch_geometric:SSGConv": lambda m: m.K,
    "torch_geometric:TAGConv": lambda m: m.K,
    "torch_geometric:MixHopConv": lambda m: max(m.powers),
    "torch_geometric:ChebConv": lambda m: len(m.lins),  # K terms: K - 1 hops (K is safe)
    "torch_geometric:AntiSymmetricConv": lambda m: m.num_iters,
    "torch_geometric:GatedGraphConv": lambda m: m.num_layers,
    "torch_geometric:ARMAConv": lambda m: m.num_layers,
    "torch_geometric:PANConv": lambda m: m.filter_size,
    "dgl:APPNPConv": lambda m: m._k,
    "dgl:SGConv": lambda m: m._k,
    "dgl:TAGConv": lambda m: m._k,
    "dgl:ChebConv": lambda m: m._k,
    "dgl:GatedGraphConv": lambda m: m._n_steps,
    "dgl:TWIRLSConv": lambda m: m.prop_step,
    "dgl:TWIRLSUnfoldingAndAttention": lambda m: m.prop_step,
    "dgl:GroupRevRes": lambda m: m.groups,  # its inner conv once per feature group
}
"""``library:Class`` -> the hops one call of the module propagates (others: 1)."""


def module_hops(module: nn.Module) -> int:
    """Hops one call of conv ``module`` propagates (``DirGNNConv``: its inner conv's)."""
    library = type(module).__module__.split(".")[0]
    name = type(module).__name__
    if library == "torch_geometric" and name == "DirGNNConv":
        return module_hops(module.conv_in)
    hops_of = _HOPS.get(f"{library}:{name}")
    return int(hops_of(module)) if hops_of is not None else 1


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
        hops = module_hops(traced.conv_module(node)) if node in traced.conv_nodes else 0
        depth[node] = base + hops
    return max(depth.values())


_DGL_DEGREE_FREE = {"SAGEConv", "GATConv", "GATv2Conv", "GINConv", "EdgeConv", "DotGatConv"}
"""DGL convs reading no node's degree; ``GraphConv``'s source out-degrees come from the
sink (module doc), its destination in-degrees are complete inside the field."""


def needs_degree_hop(model: nn.Module) -> bool:
    """Whether any conv may read whole-graph degrees (adds one hop of field): a PyG
    ``MessagePassing`` or a DGL conv not known to be degree-free (DGL ``APPNPConv``,
    ``SGConv``, ``TAGConv``, ``ChebConv`` normalize by their sources' in-degrees)."""
    message_passing = None
    if "torch_geometric" in sys.modules:
        from torch_geometric.nn import MessagePassing as message_passing
    for m in model.modules():
        name = type(m).__name__
        if message_passing is not None and isinstance(m, message_passing):
            free = name in _DEGREE_FREE
        elif type(m).__module__.startswith("dgl.nn.pytorch.conv"):
            free = name in _DGL_DEGREE_FREE or name == "GraphConv"
        else:
            continue
        if not free:
            return True
    return False


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
        self.both_ways = self.check_field()

    mode = "nodewise"
    reads_input_frontier = False  # plans carry the targets only

    @property
    def num_layers(self) -> int:
        """The receptive field in hops."""
        return int(self.hops)

    def describe(self) -> str:
        way = "in- and out-" if self.both_ways else "in-"
        return f"node-wise fallback (receptive field {self.hops} hops over {way}edges)"

    def check_field(self) -> bool:
        """Whether the receptive field must run both ways, from a probe graph: node-wise
        rows equal the model's own forward with the field over in-edges (``False``) or
        else over in- and out-edges (``True``).

        Raises:
            ValueError: neither does (the model reads nodes outside any ``hops``-hop
                field), or the model fails on a field's subgraph.
        """
        from hopserve.worker.engine.self_check import matches_forward
        from hopserve.worker.trace.probe import call_model, probe_store

        g = self.graph
        relations = g.meta.relations
        types = g.meta.node_types
        deepest = self.hops + 1  # a field's depth in either mode
        probe = probe_store(
            self.model,
            self.style,
            self.edge_args,
            g.feature_dim,
            edge_feature_dim=None if g.edge_features is None else int(g.edge_features.shape[1]),
            num_relations=None if relations is None else len(relations),
            num_node_types=None if types is None else len(types),
            num_nodes=max(PROBE_NODES, 32 * deepest + 10),  # a field: < 1/4 of it
            degree=PROBE_DEGREE,
            local=True,
        )
        dev = self.device
        try:
            with torch.no_grad(), fresh_conv_caches(self.model):
                edge = {k: v.to(dev) for k, v in probe.edge.items()}
                x, edge_index = probe.x.to(dev), probe.edge_index.to(dev)
                want = call_model(self.model, self.style, x, edge_index, edge).cpu()
        except Exception as err:  # nothing to check node-wise rows against
            raise ValueError(
                f"{type(self.model).__name__}'s own forward fails on a random probe graph "
                f"({type(err).__name__}: {err}), so its node-wise rows cannot be checked"
            ) from err
        nodes = torch.arange(probe.x.shape[0])
        errors = []
        for both_ways in (False, True):
            try:
                got = torch.cat(
                    [
                        self._forward_field(probe.store, nodes[i : i + PROBE_BATCH], both_ways)
                        for i in range(0, nodes.numel(), PROBE_BATCH)
                    ]
                )
            except Exception as err:  # the model's own error on a subgraph, at load
                raise ValueError(
                    f"node-wise evaluation fails on a probe graph's receptive field: "
                    f"{type(err).__name__}: {err}"
                ) from err
            if got.shape == want.shape and matches_forward(got, want, rtol=PROBE_RTOL):
                return both_ways
            errors.append(
                f"{(got - want).abs().max().item():.3g}" if got.shape == want.shape else "shape"
            )
        raise ValueError(
            f"node-wise evaluation of {type(self.model).__name__} differs from its own forward "
            f"on a probe graph (max abs error {errors[0]} with the {self.hops}-hop field over "
            f"in-edges, {errors[1]} over in- and out-edges): a node's output depends on nodes "
            f"outside its {self.hops}-hop neighbourhood, through an op over the whole graph "
            "(a graph-level normalization such as GraphNorm, global attention or pooling, a "
            f"global colouring) or more hops than {self.hops}; hopserve cannot serve it exactly"
        )

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
        """Rows for storage ids ``storage`` (any order, duplicates allowed), in batches,
        or by the model's own forward on the whole graph once when that is cheaper
        (:meth:`_whole_graph_pays`)."""
        t0 = time.perf_counter()
        g, size = self.graph, self.batch_size
        depth = self.field_depth(self.both_ways)
        first = storage[:size]
        if storage.numel():
            field, inner = receptive_field(g.topology, np.asarray(first), depth, self.both_ways)
            pos = field_edges(g.topology, inner, self.both_ways)
        if storage.numel() == 0:
            outs = []
        elif self._whole_graph_pays(storage.numel(), field.size + pos.size):
            everything = np.arange(g.num_nodes, dtype=np.int64)
            edges = np.arange(g.num_edges, dtype=np.int64)
            outs = [self._forward_subgraph(g, everything, everything, edges, storage)]
        else:
            outs = [self._forward_subgraph(g, field, inner, pos, first)]
            outs += [
                self.evaluate_storage(storage[i : i + size])
                for i in range(size, storage.numel(), size)
            ]
        stats = RunStats(total_s=time.perf_counter() - t0, device=str(self.device))
        stats.layers.append(LayerStats(layer=0, rows=int(storage.numel()), batches=len(outs)))
        stats.compute_s = stats.total_s
        self.last_stats = stats
        return torch.cat(outs) if outs else torch.empty(0)

    def _whole_graph_pays(self, num_targets: int, first_size: int) -> bool:
        """Whether one forward on the whole graph beats the batches: with each batch about
        as big as the first (``first_size`` nodes + edges of its field), the batches would
        do at least twice the whole graph's work, and the whole graph holds at most
        :data:`WHOLE_GRAPH_MEMORY` times that batch."""
        g = self.graph
        whole = g.num_nodes + g.num_edges
        batches = -(-num_targets // self.batch_size)
        return batches * first_size >= 2 * whole and whole <= WHOLE_GRAPH_MEMORY * first_size

    def evaluate_storage(self, targets: Tensor) -> Tensor:
        """One forward over the receptive field of storage-id ``targets``."""
        return self._forward_field(self.graph, targets, self.both_ways)

    def field_depth(self, both_ways: bool) -> int:
        """Hops of the field: the receptive field, plus one where a conv reads its
        sources' degrees. DGL ``GraphConv``'s out-degrees come from the sink on an in-edge
        field; both ways, a reversed graph's degrees are the other direction's, which
        only the extra hop completes."""
        extra = self.degree_hop or (both_ways and self.out_degree_sink)
        return self.hops + (1 if extra else 0)

    def _forward_field(self, g, targets: Tensor, both_ways: bool) -> Tensor:  # noqa: ANN001
        """The model on the receptive field of ``targets`` in graph store ``g``; the
        targets' rows."""
        topo = g.topology
        depth = self.field_depth(both_ways)
        field_np, inner_np = receptive_field(topo, np.asarray(targets), depth, both_ways)
        pos = field_edges(topo, inner_np, both_ways)
        return self._forward_subgraph(g, field_np, inner_np, pos, targets)

    def _forward_subgraph(
        self,
        g,  # noqa: ANN001 - the GraphStore
        field_np: np.ndarray,
        inner_np: np.ndarray,
        pos: np.ndarray,
        targets: Tensor,
    ) -> Tensor:
        """The model on the subgraph of nodes ``field_np`` (sorted storage ids) and edges
        ``pos`` (CSC positions), ``inner_np`` the nodes whose edges it holds; the rows of
        ``targets``."""
        topo = g.topology
        field, inner = torch.from_numpy(field_np), torch.from_numpy(inner_np)
        dst_np = np.searchsorted(topo.indptr, pos, side="right") - 1
        src = torch.searchsorted(field, torch.from_numpy(topo.indices[pos].astype(np.int64)))
        dst = torch.searchsorted(field, torch.from_numpy(dst_np.astype(np.int64)))
        x = g.features.index_select(0, field).float().to(self.device)
        edge = self._edge_data(g, torch.from_numpy(np.asarray(pos, dtype=np.int64)), field)
        if self.style == "dgl":
            out = self._dgl_forward(g, x, field, inner, src, dst, edge)
        else:
            edge_index = torch.stack([src, dst]).to(self.device)
            with torch.no_grad(), fresh_conv_caches(self.model):
                out = self.model(x, edge_index, **edge)
        return out[torch.searchsorted(field, torch.as_tensor(targets)).to(self.device)].cpu()

    def _edge_data(self, g, pos: Tensor, field: Tensor) -> dict[str, Tensor]:  # noqa: ANN001
        """The model's edge data arguments: the store's rows of the subgraph's edges
        (CSC positions ``pos``, the subgraph's edge order), and of its nodes (storage ids
        ``field``) for a node column (node type ids)."""
        return {
            arg: served_edge_values(
                column, _column_of(g, column)[field if column in NODE_COLUMNS else pos]
            ).to(self.device)
            for arg, column in self.edge_args.items()
        }

    def _dgl_forward(
        self,
        g,  # noqa: ANN001 - the GraphStore
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
            missing = g.out_degrees[field] - torch.bincount(src, minlength=sink)
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
