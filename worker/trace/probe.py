"""The probe run: the traced model on a small random graph, to learn what its values are.

Which fx values are per-node tensors (rows of the graph's nodes), which depend on the
features, which are constants: the facts the partition (:mod:`.splitter`) needs. Also the
model's own full-graph forward in its calling style (PyG ``model(x, edge_index)`` or DGL
``model(graph, x)``), used by the self-check, and the feature-width diagnosis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn

from hopserve.worker.convs.registry import NODEWISE_ADVICE
from hopserve.worker.trace.splitter import NodeFacts
from hopserve.worker.trace.tracer import ModelTraceError, TracedModel, source_line

LOCAL_REACH = 4
"""A local probe graph's edges join nodes at most this far apart on its ring."""


MAX_TYPED_PROBE_NODES = 4096
"""The largest probe a dict model gets (about 45 node types)."""


def probe_graph(num_nodes: int = 41, seed: int = 7, degree: int = 5, local: bool = False) -> Tensor:
    """A small random edge_index with self-loops, duplicates and isolated nodes
    (``degree`` edges a node on average, before the loops and duplicates).

    ``local``: every edge joins nodes at most :data:`LOCAL_REACH` apart on a ring of the
    active nodes (a ring edge each, random directions and degrees), so a node's ``d``-hop
    neighbourhood either way spans at most ``2 · LOCAL_REACH · d + 1`` nodes however deep
    ``d`` is: a probe whose fields stay a fraction of the graph."""
    gen = torch.Generator().manual_seed(seed)
    active = num_nodes - 4  # the last 4 nodes are isolated
    e = degree * num_nodes
    if local:
        ring = torch.arange(active)
        a = torch.cat([ring, torch.randint(0, active, (e - active,), generator=gen)])
        step = torch.randint(2, LOCAL_REACH + 1, (a.numel(),), generator=gen)
        step[:active] = 1
        b = (a + step) % active
        flip = torch.rand(a.numel(), generator=gen) < 0.5  # random directions
        src, dst = torch.where(flip, b, a), torch.where(flip, a, b)
    else:
        src = torch.randint(0, active, (e,), generator=gen)
        dst = torch.randint(0, active, (e,), generator=gen)
    loops = torch.arange(0, active, 5)
    src = torch.cat([src, loops, src[:10]])
    dst = torch.cat([dst, loops, dst[:10]])
    return torch.stack([src, dst])


def model_graph(style: str, edge_index: Tensor, num_nodes: int) -> object:
    """The graph argument a model of ``style`` takes: ``edge_index`` or a ``DGLGraph``."""
    if style == "dgl":
        import dgl

        return dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes)
    return edge_index


def call_model(
    model: nn.Module,
    style: str,
    x: Tensor,
    edge_index: Tensor,
    edge: dict[str, Tensor] | None = None,
) -> Tensor:
    """The model's own full-graph forward on ``(x, edge_index)``, in its calling style;
    ``edge``: its edge data arguments by name (aligned with ``edge_index``'s columns)."""
    graph = model_graph(style, edge_index, x.shape[0])
    edge = edge or {}
    return model(graph, x, **edge) if style == "dgl" else model(x, graph, **edge)


def probe_edge_data(
    edge_args: dict[str, str],
    edge_index: Tensor,
    feature_dim: int | None,
    seed: int = 5,
    num_relations: int | None = None,
    num_nodes: int | None = None,
    num_node_types: int | None = None,
    relation_ids: Tensor | None = None,
) -> dict[str, Tensor]:
    """Random edge data for the probe graph: ``{argument: tensor}`` per edge data argument
    (weights in ``[0.5, 1.5)``, so degrees stay positive; features ``[E, d_e]`` normal;
    relation ids uniform in ``0..num_relations-1``, or ``relation_ids``: a dict model's,
    :func:`~hopserve.worker.hetero.layout.probe_relation_ids`), and node type ids
    ``[num_nodes]`` (:func:`probe_node_types`).

    A node's several self-loops carry the same data: which of them PyG's
    ``add_remaining_self_loops`` keeps is an indexed assignment with repeated indices,
    the last on the CPU but unspecified on CUDA, so the model's own forward would not be
    a fixed reference there."""
    gen = torch.Generator().manual_seed(seed)
    num_edges = edge_index.shape[1]
    columns = {
        "weight": torch.rand(num_edges, generator=gen) + 0.5,
        "features": torch.randn(num_edges, feature_dim or 1, generator=gen),
        "type": torch.randint(0, num_relations or 1, (num_edges,), generator=gen),
    }  # one tensor per column: arguments served by the same column get the same values
    if relation_ids is not None:
        columns["type"] = relation_ids.clone()
    loops = (edge_index[0] == edge_index[1]).nonzero().squeeze(1)
    if loops.numel():
        node = edge_index[0, loops]
        first = torch.full((int(node.max()) + 1,), -1, dtype=torch.long)
        first.scatter_reduce_(0, node, loops, reduce="amin", include_self=False)
        for values in columns.values():
            values[loops] = values[first[node]]
    if "node_type" in edge_args.values():
        n = num_nodes if num_nodes is not None else int(edge_index.max()) + 1
        columns["node_type"] = probe_node_types(n, num_node_types or 1)
    return {arg: columns[column] for arg, column in edge_args.items()}


@dataclass
class ProbeGraph:
    """A probe graph as the model and as hopserve see it: features ``x``, ``edge_index``,
    the model's edge data arguments ``edge`` (by name), and ``store``, the same graph as
    a :class:`~hopserve.worker.graph.store.GraphStore` (storage order = node order)."""

    x: Tensor
    edge_index: Tensor
    edge: dict[str, Tensor]
    store: object


def probe_store(
    model: nn.Module,
    style: str,
    edge_args: dict[str, str],
    feature_dim: int,
    *,
    edge_feature_dim: int | None = None,
    num_relations: int | None = None,
    num_node_types: int | None = None,
    num_nodes: int = 41,
    degree: int = 5,
    local: bool = False,
) -> ProbeGraph:
    """The probe graph for ``model`` (:func:`probe_edge_index`) with random features of
    ``feature_dim`` and random edge data for its ``edge_args`` (``{argument: column}``,
    :func:`probe_edge_data`), stored in CSC order; a node type argument makes the store
    typed (:func:`typed_probe_columns`)."""
    from hopserve.worker.graph.store import GraphStore
    from hopserve.worker.hetero.layout import probe_relation_ids

    ei, n = probe_edge_index(model, style, num_nodes, degree, local)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(n, feature_dim, generator=gen)
    edge = probe_edge_data(
        edge_args,
        ei,
        edge_feature_dim,
        seed=13,
        num_relations=num_relations,
        num_nodes=n,
        num_node_types=num_node_types,
        relation_ids=probe_relation_ids(model, ei, n),
    )
    keyword = {"weight": "edge_weight", "features": "edge_attr", "type": "edge_type"}
    columns: dict = {}
    node_type = None
    for arg, column in edge_args.items():
        if column == "node_type":
            node_type = edge[arg]
        else:
            columns[keyword[column]] = edge[arg]
    if node_type is not None:  # a typed probe store: the probe's type runs
        columns |= typed_probe_columns(
            node_type, columns.get("edge_type"), ei.shape[1], feature_dim
        )
    store = GraphStore.from_edge_index(ei, x, reorder=None, **columns)
    return ProbeGraph(x, ei, edge, store)


def probe_node_types(num_nodes: int, num_types: int) -> Tensor:
    """Node type ids of a probe graph: ``num_types`` runs of consecutive ids (a typed
    store's layout), as even as they come."""
    return torch.arange(num_nodes) * num_types // max(num_nodes, 1)


def typed_probe_columns(
    node_type: Tensor, edge_type: Tensor | None, num_edges: int, feature_dim: int
) -> dict:
    """``GraphStore.from_edge_index`` arguments that make a probe graph typed: node types
    ``t0, t1, …`` from run-laid-out ``node_type`` ids (:func:`probe_node_types`), and
    relation ids (``edge_type``, or all 0) named ``t0__r<k>__t0`` (a typed store names its
    relations by their end types; the probe's edges need not lie in them, and the convs
    taking type ids do not read the names)."""
    from hopserve.worker.graph.node_types import NodeTypeInfo

    counts = torch.bincount(node_type).tolist() if node_type.numel() else [0]
    offsets = [0, *torch.tensor(counts, dtype=torch.long).cumsum(0).tolist()]
    types = [
        NodeTypeInfo(name=f"t{k}", offset=offsets[k], count=c, feature_dim=feature_dim)
        for k, c in enumerate(counts)
    ]
    if edge_type is None:
        edge_type = torch.zeros(num_edges, dtype=torch.long)
    num_relations = int(edge_type.max()) + 1 if edge_type.numel() else 1
    relations = [f"t0__r{k}__t0" for k in range(num_relations)]
    return {"node_types": types, "edge_type": edge_type, "relations": relations}


_EDGE_ENCODERS = {"GINEConv": "lin", "EGATConv": "fc_fij", "GatedGCNConv": "C"}
"""Class name -> its linear layer taking the edge features (PyG GINEConv's ``lin``: edge_dim
-> node width; DGL EGATConv's ``fc_fij``, GatedGCNConv's ``C``)."""
_FIXED_EDGE_WIDTH = {"AtomicConv": 1}  # DGL AtomicConv: one distance per edge
_EDGE_WIDTH_ATTRS = ("edge_dim", "in_edge_channels", "dim", "_dim", "_edge_feats", "edge_feat_size")


def _in_width(module: nn.Module) -> int | None:
    """Input width of a linear layer (torch's or PyG's, lazy ones excluded)."""
    for attr in ("in_features", "in_channels"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0 and "Linear" in type(module).__name__:
            return value
    return None


_RELATION_COUNT_ATTRS = ("num_relations", "num_rels", "num_etypes", "num_types")
"""Attributes holding the number of relations a typed-edge conv (or a typed linear layer in
it) has weights for (PyG ``RGCNConv``/``FastRGCNConv``/``RGATConv``/``FiLMConv``:
``num_relations``; DGL ``RelGraphConv``: its ``TypedLinear``'s ``num_types``)."""


def _typed_counts(conv: nn.Module) -> tuple[int, int] | None:
    """``(relations, node types)`` of convs that take both (their typed linear layers
    have either count, so the generic attribute search cannot tell them apart): DGL's
    ``HGTConv`` (``relation_pri``, ``skip``), PyG's ``HEATConv`` (``edge_type_emb``,
    ``hetero_lin``)."""
    if hasattr(conv, "relation_pri") and hasattr(conv, "skip") and hasattr(conv, "linear_k"):
        return int(conv.relation_pri[0].numel()), int(conv.skip.numel())
    if hasattr(conv, "edge_type_emb") and hasattr(conv, "hetero_lin"):
        return int(conv.edge_type_emb.num_embeddings), int(conv.hetero_lin.num_types)
    return None


def node_type_count(convs: list[tuple[str, nn.Module]]) -> int:
    """How many node types the convs taking node type ids have weights for (the
    smallest).

    Raises:
        ModelTraceError: a conv with no node type count to read.
    """
    counts = []
    for qual, conv in convs:
        typed = _typed_counts(conv)
        value = typed[1] if typed else getattr(conv, "num_ntypes", None)
        if not isinstance(value, int) or value <= 0:
            raise ModelTraceError(
                f"conv '{qual}' ({type(conv).__name__}) takes node type ids, but how many "
                "node types it has weights for cannot be told"
            )
        counts.append(value)
    return min(counts)


def _relation_count_of(conv: nn.Module) -> int | None:
    typed = _typed_counts(conv)
    if typed is not None:
        return typed[0]
    for module in conv.modules():  # the conv first, then its submodules
        for attr in _RELATION_COUNT_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def relation_count(convs: list[tuple[str, nn.Module]]) -> int:
    """How many relations the convs taking edge types have weights for (the smallest, so a
    relation id is valid for every one of them).

    Raises:
        ModelTraceError: a conv with no relation count to read.
    """
    counts = []
    for qual, conv in convs:
        value = _relation_count_of(conv)
        if value is None:
            raise ModelTraceError(
                f"conv '{qual}' ({type(conv).__name__}) takes edge types, but how many "
                f"relations it has weights for cannot be told (none of "
                f"{', '.join(_RELATION_COUNT_ATTRS)} is set)"
            )
        counts.append(value)
    return min(counts)


def edge_feature_width(convs: list[tuple[str, nn.Module]]) -> int:
    """The edge feature width ``d_e`` the convs taking edge features expect.

    Read from ``edge_dim`` (GAT, GATv2, Transformer, GINE, PNA, ResGatedGraph),
    ``in_edge_channels`` (GeneralConv), ``dim`` (CGConv, GMMConv, SplineConv), an edge
    encoder's input width (a linear submodule named ``*edge*``: GENConv's ``lin_edge``) or
    the first linear layer of ``nn`` (NNConv, and GINEConv without ``edge_dim``, whose
    edge features have the node features' width).

    Raises:
        ModelTraceError: a width cannot be told, or two convs expect different widths.
    """
    widths: dict[int, str] = {}
    for qual, conv in convs:
        width = None
        for attr in _EDGE_WIDTH_ATTRS:
            value = getattr(conv, attr, None)
            if isinstance(value, int) and value > 0:
                width = value
                break
        width = width or _FIXED_EDGE_WIDTH.get(type(conv).__name__)
        encoder = getattr(conv, _EDGE_ENCODERS.get(type(conv).__name__, ""), None)
        if width is None and isinstance(encoder, nn.Module):
            width = _in_width(encoder)
        if width is None:  # an edge encoder (GENConv's lin_edge)
            width = next(
                (
                    _in_width(m)
                    for name, m in conv.named_modules()
                    if "edge" in name.rsplit(".", 1)[-1] and _in_width(m)
                ),
                None,
            )
        if width is None:  # an edge network: PyG's nn, DGL's edge_func / apply_func
            inner = next(
                (
                    getattr(conv, a)
                    for a in ("nn", "edge_func", "apply_func", "project_edge")
                    if isinstance(getattr(conv, a, None), nn.Module)
                ),
                None,
            )
            first = next(
                (_in_width(m) for m in inner.modules() if _in_width(m)) if inner else iter(()),
                None,
            )
            width = first
        if width is None:
            raise ModelTraceError(
                f"conv '{qual}' ({type(conv).__name__}) takes edge features but hopserve "
                "cannot tell their width (edge_dim) to check the model on a probe graph"
            )
        widths.setdefault(width, qual)
    if len(widths) > 1:
        listed = ", ".join(f"'{q}': {w}" for w, q in widths.items())
        raise ModelTraceError(
            f"the convs taking edge features expect different widths ({listed}); the graph "
            "store holds one edge feature matrix"
        )
    return next(iter(widths))


def probe_edge_index(
    model: nn.Module, style: str, num_nodes: int = 41, degree: int = 5, local: bool = False
) -> tuple[Tensor, int]:
    """The probe graph for ``model`` and its node count (:func:`probe_graph` of
    ``num_nodes``, ``degree``, ``local``).

    A dict model's probe (its rows split evenly among its ``T`` node types while it runs,
    :func:`~hopserve.worker.hetero.layout.probe_type_ranges`) has at least
    ``max(8, 2T) · T + 8`` nodes (at most :data:`MAX_TYPED_PROBE_NODES`): every type gets
    connected rows (the last 4 are isolated) and each pair of types about 10 edges.

    DGL convs built with ``allow_zero_in_degree=False`` raise on nodes without in-edges,
    so for them every such probe node gets a self-loop (what DGL users add themselves).
    DGL probe edges are listed by (destination, source): DGL's UDF reducers (e.g. the LSTM
    aggregator) read messages in edge-id order, which is then the store's CSC order.
    """
    layout = getattr(model, "layout", None)
    types = len(getattr(layout, "names", ()))
    if types and not local:  # a dict model: every type some rows, each pair ~10 edges
        num_nodes = max(num_nodes, min(MAX_TYPED_PROBE_NODES, max(8, 2 * types) * types + 8))
    ei = probe_graph(num_nodes, degree=degree, local=local)
    n = int(ei.max()) + 5
    if style != "dgl":
        return ei, n
    from hopserve.worker.convs.dgl_conv import refuses_zero_in_degree

    if any(refuses_zero_in_degree(m) for m in model.modules()):
        lonely = torch.ones(n, dtype=torch.bool)
        lonely[ei[1]] = False
        loops = lonely.nonzero().squeeze(1)
        ei = torch.cat([ei, torch.stack([loops, loops])], dim=1)
    return ei[:, torch.argsort(ei[1] * n + ei[0], stable=True)], n


def probe_facts(
    traced: TracedModel,
    x: Tensor,
    edge_index: Tensor,
    edge: dict[str, Tensor] | None = None,
) -> tuple[dict[fx.Node, NodeFacts], Tensor]:
    """Run the traced model once, recording which values are per-node tensors (``edge``:
    the edge data arguments' probe values)."""
    n = x.shape[0]
    feature_dep: set[fx.Node] = set()
    facts: dict[fx.Node, NodeFacts] = {}
    values: dict[fx.Node, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node: fx.Node) -> object:
            out = super().run_node(node)
            values[node] = out
            return out

    with torch.no_grad():
        graph = model_graph(traced.style, edge_index, n)
        out = Recorder(traced.gm).run(*_ordered_inputs(traced, x, graph, edge))
    for node in traced.gm.graph.nodes:
        if node.op == "placeholder":
            if node.target == traced.feature_arg:
                feature_dep.add(node)
                facts[node] = NodeFacts(row=True, const=False)
            continue
        if node.op == "output":
            continue
        dep = any(i in feature_dep for i in node.all_input_nodes)
        if dep:
            feature_dep.add(node)
        v = values.get(node)
        row = isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == n
        bundle = dep and not row and not isinstance(v, Tensor)
        if dep and isinstance(v, Tensor) and not row:
            raise ModelTraceError(
                f"'{node.name}' at {source_line(node)} produces a tensor of shape "
                f"{tuple(v.shape)} that is not per-node (first dimension != {n} nodes); "
                "ops outside convs must be node-wise for layer-wise evaluation. "
                f"{NODEWISE_ADVICE}."
            )
        facts[node] = NodeFacts(row=row, const=not dep, bundle=bundle)
    if not isinstance(out, Tensor) or out.dim() < 1 or out.shape[0] != n:
        raise ModelTraceError(
            f"the model must return one per-node tensor [num_nodes, ...]; got {type(out).__name__}"
        )
    return facts, out


def _ordered_inputs(
    traced: TracedModel, x: Tensor, graph: object, edge: dict[str, Tensor] | None = None
) -> list[object]:
    names = [n.target for n in traced.gm.graph.nodes if n.op == "placeholder"]
    by_name = {traced.feature_arg: x, traced.graph_arg: graph, **(edge or {})}
    return [by_name[name] for name in names if name in by_name]


class FeatureWidthError(ModelTraceError):
    """The graph's feature width is not what the model's first layer expects (a config
    mistake, not a reason to fall back to node-wise evaluation)."""


_WIDTH_ATTRS = ("in_channels", "in_features", "in_feats", "_in_feats", "_in_src_feats")


def input_width_mismatch(traced: TracedModel, feature_dim: int) -> str | None:
    """``"graph has F-dim features, model's first layer 'name' (Cls) expects W (check
    kwargs)"`` when the first module reading the features declares another width."""
    reached: set[fx.Node] = set()
    for node in traced.gm.graph.nodes:  # topological order: the first module fed by x
        if node.op == "placeholder":
            if node.target == traced.feature_arg:
                reached.add(node)
            continue
        if not any(i in reached for i in node.all_input_nodes):
            continue
        reached.add(node)
        if node.op != "call_module":
            continue
        module = traced.gm.get_submodule(str(node.target))
        for attr in _WIDTH_ATTRS:
            width = getattr(module, attr, None)
            if isinstance(width, tuple | list) and width:
                width = width[0]
            if isinstance(width, int) and width > 0:
                if width == feature_dim:
                    return None
                return (
                    f"graph has {feature_dim}-dim features, model's first layer "
                    f"'{node.target}' ({type(module).__name__}) expects {width} (check the "
                    "model's kwargs, or the graph the config names)"
                )
    return None


__all__ = [
    "FeatureWidthError",
    "call_model",
    "edge_feature_width",
    "input_width_mismatch",
    "model_graph",
    "node_type_count",
    "probe_edge_data",
    "probe_edge_index",
    "probe_facts",
    "probe_graph",
    "probe_node_types",
    "relation_count",
    "typed_probe_columns",
]
