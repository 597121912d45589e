"""Trace a GNN model with torch.fx, keeping conv modules as leaves (DGI §3.1).

Call order::

    trace_model(model)
      ├─ _signature()        which forward() argument is the graph, which the features,
      │                      which carry edge data (``edge_weight`` / ``edge_attr``)
      ├─ ConvLeafTracer.trace  fx trace; convs (support-matrix classes, any MessagePassing)
      │                        and torch.nn built-ins stay leaves, user modules are inlined
      ├─ eliminate_dead_code
      └─ _check_graph_uses   the graph input and the edge data inputs may only feed convs

PyG-style ``forward(x, edge_index)`` is the default; DGL-style ``forward(graph, x)`` is
recognised by argument names (``g``/``graph``/``block``/``blocks`` first). Edge data
arguments stay placeholders: ``edge_weight``-like names are served from the graph store's
edge weights, ``edge_attr``-like names from its edge features (:data:`EDGE_COLUMNS`); each
conv receiving one gathers the rows of its batch's edges (:mod:`hopserve.worker.convs`).
A ``node_type``-like argument (DGL's ``ntype``) is served the same way from a typed
store's node type ids, one row per node: a conv gets its batch's source rows'. DGL convs
(``dgl.nn.pytorch``) are leaves like PyG's and are called ``conv(graph, h)``; modules that
need a heterograph are refused before tracing (:func:`~.registry.early_refusal`).
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from hopserve.worker.convs.base import NODE_COLUMNS
from hopserve.worker.convs.registry import NODEWISE_ADVICE, early_refusal, is_conv_module

_GRAPH_ARG_NAMES = {"edge_index", "adj", "adj_t", "g", "graph", "block", "blocks", "mfg"}
_FX_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


class ModelTraceError(ValueError):
    """The model cannot be split into ConvBlocks; the message names the module or line."""


def _leaf_types() -> tuple[type, ...]:
    """Node-wise modules whose forward fx cannot or need not trace into: PyG's / DGL's, and
    the typed ones of a dict model's homogeneous form."""
    from hopserve.worker.hetero.modules import TypedMerge, TypedRows

    leaves: tuple[type, ...] = (TypedRows, TypedMerge)
    pyg_nn = sys.modules.get("torch_geometric.nn")  # only when the model's code imported PyG
    if getattr(pyg_nn, "JumpingKnowledge", None) is not None:
        leaves += (pyg_nn.JumpingKnowledge,)
    dglnn = sys.modules.get("dgl.nn.pytorch")  # only when the model's code imported DGL
    if getattr(dglnn, "JumpingKnowledge", None) is not None:
        leaves += (dglnn.JumpingKnowledge,)
    return leaves


class ConvLeafTracer(fx.Tracer):
    """fx tracer that records stack traces and keeps convs and node-wise leaves whole."""

    def __init__(self) -> None:
        super().__init__()
        self.record_stack_traces = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if is_conv_module(m) or isinstance(m, _leaf_types()):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def source_line(node: fx.Node) -> str:
    """``file:line (code)`` of the innermost user frame that created ``node``."""
    trace = node.stack_trace or ""
    frames = [
        m for m in _FX_FRAME.finditer(trace) if "/torch/fx/" not in m.group(1).replace("\\", "/")
    ]
    if not frames:
        return f"node '{node.name}'"
    f = frames[-1]
    return f"{f.group(1)}:{f.group(2)} ({f.group(4).strip()})"


@dataclass
class TracedModel:
    """An fx graph of the model plus which placeholders carry the graph and the features."""

    gm: fx.GraphModule
    feature_arg: str
    graph_arg: str
    style: str  # "pyg" | "dgl"
    conv_nodes: list[fx.Node]
    # forward() arguments carrying edge data -> the store column serving them
    edge_args: dict[str, str] = field(default_factory=dict)

    def conv_module(self, node: fx.Node) -> nn.Module:
        return self.gm.get_submodule(str(node.target))


_EDGE_DATA_ARG = re.compile(
    r"(edge_(weight|attr|feat|feature|type|norm)|e_?feats?|e_?weight|etype|edge_w"
    r"|node_type|ntype|n_type)s?"
)
"""Names of ``forward`` parameters that carry graph data besides the features: per-edge
data, and the per-node type ids of a typed graph (served the same way)."""
_EDGE_WEIGHT_ARG = re.compile(r"(edge_weight|e_?weight|edge_w)s?")
_EDGE_FEATURE_ARG = re.compile(r"(edge_(attr|feat|feature)|e_?feats?)s?")
_EDGE_TYPE_ARG = re.compile(r"(edge_type|etype|e_type|rel_type)s?")
_NODE_TYPE_ARG = re.compile(r"(node_type|ntype|n_type)s?")
EDGE_COLUMNS = {
    "weight": "edge_weight",
    "features": "edge_features",
    "type": "edge_type",
    "node_type": "node_type_ids",
}
"""Store column names (``GraphStore`` attributes) by kind: an ``edge_weight``-like argument
is served from ``edge_weight`` ``[E]``, an ``edge_attr``-like one from ``edge_features``
``[E, d_e]``, an ``edge_type``-like one (relation ids) from ``edge_type`` ``[E]``, a
``node_type``-like one (DGL's ``ntype``) from a typed store's ``node_type_ids`` ``[N]``
(:data:`NODE_COLUMNS`: one row per node, not per edge). Other edge data (``edge_norm``)
is refused."""


def edge_column(name: str) -> str | None:
    """``"weight"`` / ``"features"`` / ``"type"`` / ``"node_type"`` for a served graph
    data argument name, else ``None``."""
    if _EDGE_WEIGHT_ARG.fullmatch(name):
        return "weight"
    if _EDGE_FEATURE_ARG.fullmatch(name):
        return "features"
    if _EDGE_TYPE_ARG.fullmatch(name):
        return "type"
    if _NODE_TYPE_ARG.fullmatch(name):
        return "node_type"
    return None


def missing_edge_data_message(model_name: str, arg: str, column: str | None = None) -> str:
    """Why a model taking edge data ``arg`` is refused on a graph without that column."""
    if column in NODE_COLUMNS:
        return (
            f"{model_name}.forward takes node type ids '{arg}', which an untyped graph "
            "store does not have: serve it from a typed store (GraphStore.from_hetero, "
            "from_pyg(HeteroData), from_dgl(heterograph)), whose node types are its ids"
        )
    held = f" ({EDGE_COLUMNS[column]})" if column else ""
    return (
        f"{model_name}.forward accepts edge data '{arg}', which the graph store does not "
        f"hold{held}: served without it, a model trained with it would give other "
        "embeddings. Serve a forward without the parameter (e.g. a subclass whose "
        "forward(x, edge_index) calls the parent's) if the model does not use it"
    )


def edge_data_args(model: nn.Module) -> list[str]:
    """Names of ``model.forward``'s parameters that carry graph data (per-edge data, node
    type ids)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return []
    return [name for name in params if _EDGE_DATA_ARG.fullmatch(name)]


def _signature(
    model: nn.Module,
) -> tuple[str, str, str, dict[str, object], dict[str, str]]:
    params = [
        p
        for p in inspect.signature(model.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if len(params) < 2:
        raise ModelTraceError(
            f"{type(model).__name__}.forward must take (x, edge_index) or (graph, x); "
            f"got ({', '.join(p.name for p in params)})"
        )
    first, second, rest = params[0], params[1], params[2:]
    if first.name in _GRAPH_ARG_NAMES and second.name not in _GRAPH_ARG_NAMES:
        graph_arg, feature_arg, style = first.name, second.name, "dgl"
    else:
        feature_arg, graph_arg, style = first.name, second.name, "pyg"
    concrete: dict[str, object] = {}
    edge_args: dict[str, str] = {}
    for p in rest:
        column = edge_column(p.name)
        if column is not None:
            edge_args[p.name] = column  # a placeholder: served from the store's column
            continue
        if _EDGE_DATA_ARG.fullmatch(p.name):
            reason = (
                "only edge weights (edge_weight), edge features (edge_attr), edge "
                "types (edge_type) and node types (node_type) are served, not edge norms"
            )
            raise ModelTraceError(
                f"{type(model).__name__}.forward accepts edge data '{p.name}', which "
                f"hopserve cannot serve ({reason}): served without it, a model trained "
                "with it would give other embeddings. Serve a forward without the "
                "parameter (e.g. a subclass whose forward(x, edge_index) calls the "
                "parent's) if the model does not use it"
            )
        if p.default is inspect.Parameter.empty:
            raise ModelTraceError(
                f"{type(model).__name__}.forward has a required extra argument '{p.name}'; "
                "only (features, graph) inputs and edge data (edge_weight, edge_attr, "
                "edge_type, node_type) are supported"
            )
        concrete[p.name] = p.default
    return feature_arg, graph_arg, style, concrete, edge_args


def _check_graph_uses(traced: TracedModel) -> None:
    placeholders = {n.target: n for n in traced.gm.graph.nodes if n.op == "placeholder"}
    for name in (traced.graph_arg, *traced.edge_args):
        node = placeholders.get(name)
        if node is None:
            continue
        for user in node.users:
            if user.op == "call_module" and is_conv_module(
                traced.gm.get_submodule(str(user.target))
            ):
                continue
            what = "graph" if name == traced.graph_arg else "edge data"
            raise ModelTraceError(
                f"the {what} input '{name}' is used outside a conv by "
                f"'{user.name}' at {source_line(user)}; layer-wise evaluation needs the "
                f"{what} to reach convs only (edge dropout, self-loop insertion, edge "
                "transforms or pooling in forward() are not node-wise). "
                f"{NODEWISE_ADVICE}."
            )


def _user_frame(err: BaseException, model: nn.Module) -> str:
    """`` at file:line`` of the innermost frame in the model's own source file."""
    try:
        model_file = inspect.getsourcefile(type(model))
    except TypeError:
        model_file = None
    tb, best, fallback = err.__traceback__, "", ""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if model_file and path == model_file:
            best = f" at {path}:{tb.tb_lineno}"
        elif "site-packages" not in path and "/torch/" not in path:
            fallback = f" at {path}:{tb.tb_lineno}"
        tb = tb.tb_next
    return best or fallback


def trace_model(model: nn.Module) -> TracedModel:
    """Trace ``model`` (in eval mode) into an fx graph with convs as leaves.

    Raises:
        ModelTraceError: the model is not traceable, uses the graph outside convs, or has
            no conv; the message names the module or source line.
    """
    model.eval()
    refusal = early_refusal(model)
    if refusal is not None:
        raise ModelTraceError(str(refusal)) from refusal
    feature_arg, graph_arg, style, concrete, edge_args = _signature(model)
    tracer = ConvLeafTracer()
    try:
        graph = tracer.trace(model, concrete_args=concrete or None)
    except Exception as err:  # fx raises many types; surface the user's line
        where = _user_frame(err, model)
        raise ModelTraceError(
            f"{type(model).__name__} cannot be traced by torch.fx{where}: "
            f"{type(err).__name__}: {err}. {NODEWISE_ADVICE}."
        ) from err
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    conv_nodes = [
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and is_conv_module(gm.get_submodule(str(n.target)))
    ]
    traced = TracedModel(gm, feature_arg, graph_arg, style, conv_nodes, edge_args)
    if not conv_nodes:
        raise ModelTraceError(f"{type(model).__name__} has no graph conv reaching its output")
    _check_graph_uses(traced)
    return traced


def is_row_tensor(value: object, num_nodes: int) -> bool:
    """A per-node tensor: first dimension equals the number of nodes."""
    return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == num_nodes
