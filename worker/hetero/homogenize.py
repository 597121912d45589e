"""A dict model (``forward(x_dict, edge_index_dict)``) as a model of the store's homogeneous
form (``forward(x, edge_index, edge_type)``), which the engine splits as any other.

The user's model is traced with fx on concrete dicts (one placeholder per node type and
per relation, so ``x_dict.items()`` and ``x_dict["paper"]`` work), with each
``HeteroConv`` a leaf returning its destination types. Then every per-type value is
rebuilt as a table over all rows, meaningful on its type's rows
(:mod:`.modules`):

- ``x_dict[t]`` is the feature table's first ``feature_dim_t`` columns;
- a ``HeteroConv`` becomes a :class:`~.modules.HeteroLayer` (a conv for the engine) on
  one input table (a :class:`~.modules.TypedMerge` of its types' values where they
  differ), its output for type ``t`` that table's first ``width_t`` columns;
- a function or method on one type's values is the same op on the tables (a row-wise op
  gives the right rows; the other rows are never read), identical calls made once: the
  per-type ``relu`` of ``{k: v.relu() for k, v in x_dict.items()}`` is one op;
- a leaf module on one type's value is a :class:`~.modules.TypedRows`, except a
  parameter-free elementwise one (dropout, an activation: :data:`ELEMENTWISE_MODULES`),
  which is the same module on the table, as a function is: the per-type ``dropout`` of
  DGL's rgcn-hetero example layer is one op, and what reads it (the next layer's
  self-loop ``matmul``) one op, not one per type;
- a write into a value (in place, ``out=``, an ``inplace=True`` module) runs out of
  place, or on a copy, and the value reads the result: a table may be several types'
  values, and identical calls are made once; a write into a view of a value is refused;
- the model's output (one type's value, or a dict of them) is one table; the types it
  holds are the model's output types (:attr:`HomogeneousModel.output_types`).

Per-relation edge data (``edge_attr_dict``, ``edge_weight_dict`` arguments, passed on by
``HeteroConv`` or to a ``to_hetero`` relation conv, or through DGL ``HeteroGraphConv``'s
``mod_kwargs`` keyed by etype) is the store's edge column, an
``edge_attr`` / ``edge_weight`` argument of the homogeneous form, of which each relation
conv gets its relation's rows.

Refused with the reason (:class:`~hopserve.worker.trace.tracer.ModelTraceError`): ops
mixing two types' values, edge data the store lacks, relation convs needing a
whole-graph statistic, and dict convs other than ``HeteroConv``.
"""

from __future__ import annotations

import inspect
import math
import operator
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.fx._symbolic_trace import PH
from torch.utils import _pytree as pytree

from hopserve.worker.hetero.layout import TypeLayout
from hopserve.worker.hetero.modules import (
    DictConvLayer,
    HeteroLayer,
    ParamKwargs,
    RelationCall,
    TypedMerge,
    TypedRows,
    zero_in_degree_allowed,
)

__all__ = ["HomogeneousModel", "as_homogeneous", "homogenize", "is_dict_model"]

DICT_CONVS = frozenset({"HGTConv"})
"""Convs taking per-type dicts whose output for a node reads its own row and its in-edges
only (over all relations), run on each batch's typed subgraph (:class:`DictConvLayer`)."""

ELEMENTWISE_MODULES = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.FeatureAlphaDropout, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.CELU, nn.SELU,
    nn.GELU, nn.SiLU, nn.Mish, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softsign, nn.Hardtanh,
    nn.Hardswish, nn.Hardsigmoid, nn.Hardshrink, nn.Softshrink, nn.Tanhshrink,
    nn.LogSigmoid, nn.Threshold,
)  # fmt: skip
"""Modules (these classes exactly, not subclasses) whose output row is a function of the
input row alone, the same for every node type, with no parameters: applied to a whole
table they give every type's rows, so a dict model's per-type calls of one, or of copies
of one configuration, are one op (unless in place or hooked: see
:meth:`_Builder._module`)."""
DICT_CONV_REFUSALS = {
    "HANConv": "its semantic-level attention averages a score over every node of a type, "
    "so a node's output depends on all nodes, not on its in-edges",
}


def _is_dgl_dict_model(model: nn.Module) -> bool:
    """A DGL model over a heterograph: ``forward(graph, x_dict)`` with a ``HeteroGraphConv``."""
    dglnn = sys.modules.get("dgl.nn.pytorch")
    hetero = getattr(dglnn, "HeteroGraphConv", None)
    return hetero is not None and any(isinstance(m, hetero) for m in model.modules())


def _is_to_hetero(model: nn.Module) -> bool:
    """PyG's ``to_hetero`` of a model: a graph module unpacking its arguments' dicts (which
    keep the homogeneous model's names, ``edge_attr`` included)."""
    return isinstance(model, fx.GraphModule) and any(
        n.op == "call_function" and getattr(n.target, "__name__", "") == "get_dict"
        and "to_hetero" in getattr(n.target, "__module__", "")
        for n in model.graph.nodes
    )  # fmt: skip


def is_dict_model(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes per-type dicts: its first argument is ``*_dict``, it
    is PyG's ``to_hetero`` of a model (a graph module unpacking dicts), or a DGL model with
    a ``HeteroGraphConv`` (``forward(graph, x_dict)``)."""
    if _is_dgl_dict_model(model) or _is_to_hetero(model):
        return True
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].endswith("_dict")


class HomogeneousModel(fx.GraphModule):
    """A dict model rebuilt over the homogeneous form; ``model`` holds the user's module."""

    layout: TypeLayout
    output_types: tuple[str, ...]
    output_dims: tuple[int, ...]
    """Width of each output type's embeddings (aligned with ``output_types``; the table
    pads the narrower with zeros)."""


def _error(message: str) -> Exception:
    from hopserve.worker.trace.tracer import ModelTraceError

    return ModelTraceError(message)


def _written_argument(node: fx.Node) -> fx.Node | None:
    """The value a traced call writes into, or ``None``: its ``out=`` tensor, or its
    first argument when it is in place (``inplace=True`` by keyword or position, a tensor
    method ending in ``_`` such as ``relu_``, a torch function ending in ``_`` such as
    ``torch.relu_``)."""
    out = node.kwargs.get("out")
    if isinstance(out, fx.Node):
        return out
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.op == "call_method":
        return node.args[0] if _underscored(str(node.target)) else None
    if node.op != "call_function":
        return None
    if _underscored(getattr(node.target, "__name__", "")) and _torch_function(node.target):
        return node.args[0]
    if node.kwargs.get("inplace") is True:
        return node.args[0]
    try:
        bound = inspect.signature(node.target).bind_partial(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # a builtin without a signature, or other arguments
        return None
    return node.args[0] if bound.arguments.get("inplace") is True else None


def _underscored(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_")


def _torch_function(target: Any) -> bool:
    return getattr(target, "__module__", None) in ("torch", "torch.nn.functional")


_VIEWS = frozenset(
    {"view", "view_as", "reshape", "narrow", "select", "transpose", "t", "permute",
     "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten", "split",
     "chunk", "unbind", "diagonal", "as_strided", "detach", "__getitem__"}
)  # fmt: skip


def _is_view(node: fx.Node, of_tensor: bool) -> bool:
    """Whether ``node`` may be a view of another value (an in-place write into it would
    change that value too); ``of_tensor``: its first argument is a tensor (an item of a
    dict, such as ``x_dict[t]``, is the value itself)."""
    if node.op == "call_function":
        if node.target is operator.getitem:
            return of_tensor
        return getattr(node.target, "__name__", "") in _VIEWS
    return node.op == "call_method" and str(node.target) in _VIEWS


def _out_of_place(node: fx.Node, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """``(target, args, kwargs)`` of the out-of-place form of a call that writes a value.

    Raises:
        ModelTraceError: an in-place method or function with no out-of-place form (naming
            it).
    """
    if "out" in kwargs:
        return node.target, args, {k: v for k, v in kwargs.items() if k != "out"}
    name = str(node.target) if node.op == "call_method" else node.target.__name__
    if _underscored(name):
        plain = name[:-1]
        if node.op == "call_method":
            target = plain if callable(getattr(Tensor, plain, None)) else None
        else:
            homes = (torch, torch.nn.functional)
            target = next((getattr(m, plain) for m in homes if hasattr(m, plain)), None)
        if target is None:
            raise _error(
                f"'{node.name}': {name} writes one node type's value in place and has no "
                "out-of-place form; write it out of place"
            )
        return target, args, kwargs
    try:
        at = list(inspect.signature(node.target).parameters).index("inplace")
    except ValueError:  # pragma: no cover - found in place by its inplace argument
        at = len(args)
    if at < len(args):  # passed by position
        return node.target, (*args[:at], False, *args[at + 1 :]), kwargs
    return node.target, args, {**kwargs, "inplace": False}


def _hetero_conv_class() -> type | None:
    """PyG's ``HeteroConv``, if PyG is imported: a model holding one has imported it, and a
    DGL model need not pay for importing PyG (about 60 MB of modules, as the conv registry
    avoids)."""
    if "torch_geometric" not in sys.modules:
        return None
    try:
        from torch_geometric.nn import HeteroConv
    except ImportError:  # pragma: no cover - PyG is a dependency
        return None
    return HeteroConv


class _DictTracer(fx.Tracer):
    """fx tracer keeping ``HeteroConv`` and convs whole; a leaf that returned a dict on
    the example graph (``outputs``: its keys) returns ``{key: proxy[key]}``."""

    def __init__(self, outputs: dict[nn.Module, tuple[str, ...]]) -> None:
        super().__init__()
        self.record_stack_traces = True
        self.hetero_cls = _hetero_conv_class()
        self.outputs = outputs

    def _is_hetero(self, m: nn.Module) -> bool:
        return self.hetero_cls is not None and isinstance(m, self.hetero_cls)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        from hopserve.worker.convs.registry import is_conv_module

        if self._is_hetero(m) or is_conv_module(m):
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):  # noqa: ANN001 - fx's signature
        out = super().call_module(m, forward, args, kwargs)
        if m in self.outputs and self.is_leaf_module(m, ""):
            return {key: out[key] for key in self.outputs[m]}
        return out

    dgl: bool = False
    """Whether the model is a DGL dict model (its first argument the heterograph)."""

    def _is_graph(self, node: Any) -> bool:
        """The heterograph (the first placeholder), or its ``local_var()`` (DGL's idiom
        for a scratch copy)."""
        if not self.dgl or not isinstance(node, fx.Node):
            return False
        if node.op == "placeholder":
            return node is next(n for n in node.graph.nodes if n.op == "placeholder")
        return (
            node.op == "call_method" and node.target == "local_var" and self._is_graph(node.args[0])
        )

    def to_bool(self, obj: fx.Proxy) -> bool:
        """``graph.is_block`` is False: the model is traced for, and served from, the whole
        heterograph (DGL models branch on it to slice destination rows of a block)."""
        if (
            isinstance(obj, fx.proxy.Attribute)
            and obj.attr == "is_block"
            and self._is_graph(obj.root.node)
        ):
            return False
        return super().to_bool(obj)

    def iter(self, obj: fx.Proxy) -> Any:
        """A value computed from parameters only (``torch.split(weight, 1)`` of per-relation
        weights, as DGL's rgcn-hetero example makes them) iterates over its items; any
        other proxy cannot be iterated (fx's error)."""
        value = self.parameter_value(obj.node)
        if value is None or not hasattr(value, "__len__"):
            return super().iter(obj)
        return iter([obj[i] for i in range(len(value))])

    def parameter_value(self, node: fx.Node, memo: dict | None = None) -> Any:
        """The value of ``node`` when it reads parameters and constants only, else
        ``None``."""
        memo = {} if memo is None else memo
        if node in memo:
            return memo[node]
        # Not call_module: fx's patched Module.__call__ would record into the traced graph.
        if node.op not in ("get_attr", "call_function", "call_method"):
            return None
        inputs = {}
        for n in node.all_input_nodes:
            v = self.parameter_value(n, memo)
            if v is None:
                return None
            inputs[n] = v
        args = fx.node.map_arg(node.args, inputs.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, inputs.__getitem__)
        with torch.no_grad():
            if node.op == "get_attr":
                value = _fetch_attr(self.root, str(node.target))
            elif node.op == "call_function":
                value = node.target(*args, **kwargs)
            else:
                value = getattr(args[0], node.target)(*args[1:], **kwargs)
        memo[node] = value
        return value


def _fetch_attr(root: nn.Module, target: str) -> Any:
    """``root``'s attribute ``target`` (dotted), read from the modules' own dicts: while fx
    traces, ``Module.__getattr__`` hands out proxies of parameters."""
    value: Any = root
    for part in target.split("."):
        if isinstance(value, nn.Module):
            for store in (value._parameters, value._buffers, value._modules, value.__dict__):
                if part in store:
                    value = store[part]
                    break
            else:
                raise AttributeError(target)
        else:
            value = getattr(value, part)
    return value


def parameter_only(node: fx.Node) -> bool:
    """Whether ``node`` reads no input of the model (parameters and constants only)."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return False
        todo.extend(n.all_input_nodes)
    return True


def _example(
    layout: TypeLayout, device: torch.device, seed: int = 3
) -> tuple[dict[str, Tensor], dict[tuple, Tensor]]:
    """A tiny typed graph of the layout (5 nodes a type, 12 edges a relation)."""
    gen = torch.Generator().manual_seed(seed)
    n = 5
    x = {
        name: torch.randn(n, dim, generator=gen).to(device)
        for name, dim in zip(layout.names, layout.feature_dims, strict=True)
        if dim > 0
    }
    edges = {
        rel: torch.randint(0, n, (2, 12), generator=gen).to(device) for rel in layout.relations
    }
    return x, edges


_EDGE_ARG = {"features": "edge_attr", "weight": "edge_weight"}
"""The homogeneous form's argument serving each edge column (the tracer's names)."""


def _edge_data_column(name: str, bare: bool = False) -> str | None:
    """The edge column a dict model's per-relation edge data argument reads:
    ``edge_attr_dict`` -> ``"features"``, ``edge_weight_dict`` -> ``"weight"`` (with
    ``bare``, a ``to_hetero`` model's ``edge_attr`` / ``edge_weight`` too), else ``None``."""
    from hopserve.worker.trace.tracer import edge_column

    if name.endswith("_dict"):
        name = name[: -len("_dict")]
    elif not bare:
        return None
    column = edge_column(name)
    return column if column in _EDGE_ARG else None


def _example_edge_data(
    layout: TypeLayout, column: str, width: int, device: torch.device, seed: int = 4
) -> dict[tuple, Tensor]:
    """Per-relation example rows of an edge column (for :func:`_example`'s 12 edges)."""
    gen = torch.Generator().manual_seed(seed)
    if column == "weight":
        return {r: (torch.rand(12, generator=gen) + 0.5).to(device) for r in layout.relations}
    return {r: torch.randn(12, width, generator=gen).to(device) for r in layout.relations}


def _dict_outputs(
    model: nn.Module, example: tuple, example_kw: dict | None = None
) -> dict[nn.Module, tuple[str, ...]]:
    """The keys (with a tensor) of each submodule's dict output on the example graph."""
    outputs: dict[nn.Module, tuple[str, ...]] = {}

    def hook(module: nn.Module, _args: Any, out: Any) -> None:
        if isinstance(out, dict):
            outputs[module] = tuple(k for k, v in out.items() if isinstance(v, Tensor))

    handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    try:
        with torch.no_grad():
            model(*example, **(example_kw or {}))
    finally:
        for h in handles:
            h.remove()
    return outputs


class _Shapes(fx.Interpreter):
    """Runs the dict graph on the example, keeping each node's result's shape."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.shapes: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, Tensor):
            self.shapes[n] = tuple(result.shape)
        elif isinstance(result, dict):
            self.shapes[n] = {k: tuple(v.shape) for k, v in result.items() if isinstance(v, Tensor)}
        return result


class _Value:
    """A dict-graph node's value in the homogeneous graph."""

    def __init__(self, node: fx.Node | None, type_index: int | None = None, kind: str = "tensor",
                 payload: Any = None) -> None:  # fmt: skip
        self.node = node
        self.type_index = type_index  # None: not per-type (a constant, a parameter)
        self.kind = kind  # "tensor" | "edges" | "hetero"
        self.payload = payload


def homogenize(
    model: nn.Module, layout: TypeLayout, edge_columns: dict[str, int] | None = None
) -> HomogeneousModel:
    """Rebuild dict model ``model`` over the homogeneous form of a store laid out as
    ``layout`` (see the module doc); ``edge_columns``: the store's edge data columns
    (``"features"``: their width, ``"weight"``: 1), which per-relation edge data
    arguments (``edge_attr_dict``, ``edge_weight_dict``) are served from.

    Raises:
        ModelTraceError: naming the op, module or argument that cannot be rebuilt.
    """
    return _Builder(model, layout, edge_columns or {}).build()


class _Builder:
    def __init__(self, model: nn.Module, layout: TypeLayout, edge_columns: dict[str, int]) -> None:
        self.model = model
        self.layout = layout
        self.edge_columns = edge_columns
        self.edge_data: dict[str, str] = {}  # the model's edge data dict argument -> column
        self.g = fx.Graph()
        self.root = nn.Module()
        self.root.add_module("model", model)
        self.layers = nn.ModuleList()
        self.typed = nn.ModuleList()
        self.root.add_module("hetero_layers", self.layers)
        self.root.add_module("typed", self.typed)
        self.values: dict[fx.Node, _Value] = {}
        self.cse: dict[str, fx.Node] = {}
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.feature_slices: set[fx.Node] = set()

    # ------------------------------------------------------------------ trace
    def _trace(self) -> tuple[fx.GraphModule, list[tuple[str, Any]], Any]:
        params = [
            p
            for p in inspect.signature(self.model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        name = type(self.model).__name__
        if len(params) < 2:
            raise _error(f"{name}.forward must take (x_dict, edge_index_dict)")
        self.dgl = _is_dgl_dict_model(self.model)
        if self.dgl:  # forward(graph, x_dict): the heterograph first
            edge_arg, x_arg = params[0].name, params[1].name
        else:
            x_arg, edge_arg = params[0].name, params[1].name
        for p in params[2:]:
            column = _edge_data_column(p.name, bare=_is_to_hetero(self.model))
            if column is not None:
                if column not in self.edge_columns:
                    from hopserve.worker.trace.tracer import missing_edge_data_message

                    raise _error(missing_edge_data_message(name, p.name, column))
                self.edge_data[p.name] = column
                continue
            if p.default is inspect.Parameter.empty:
                raise _error(
                    f"{name}.forward has a required extra argument '{p.name}'; a dict model "
                    "is served from (x_dict, edge_index_dict) and per-relation edge data "
                    "(edge_attr_dict, edge_weight_dict) only"
                )
        x_types = [t for t, d in zip(self.layout.names, self.layout.feature_dims, strict=True) if d]
        concrete: dict[str, Any] = {
            x_arg: dict.fromkeys(x_types, PH),
            edge_arg: PH if self.dgl else dict.fromkeys(self.layout.relations, PH),
        }
        concrete.update({p.name: p.default for p in params[2:] if p.name not in self.edge_data})
        concrete.update({a: dict.fromkeys(self.layout.relations, PH) for a in self.edge_data})
        x_ex, e_ex = _example(self.layout, self.device)
        self.example = (_heterograph(self.layout, e_ex), x_ex) if self.dgl else (x_ex, e_ex)
        self.example_edge = {
            a: _example_edge_data(self.layout, column, self.edge_columns[column], self.device)
            for a, column in self.edge_data.items()
        }
        try:
            with zero_in_degree_allowed(self.model):  # the tiny example has such nodes
                outputs = _dict_outputs(self.model, self.example, self.example_edge)
        except Exception as err:
            raise _error(
                f"{name} failed on a small typed graph of the store's types "
                f"({type(err).__name__}: {err})"
            ) from err
        tracer = _DictTracer(outputs)
        tracer.dgl = self.dgl
        try:
            graph = tracer.trace(self.model, concrete_args=concrete)
        except Exception as err:
            raise _error(
                f"{name} could not be traced on per-type dicts ({type(err).__name__}: {err})"
            ) from err
        out_spec = graph._codegen.pytree_info.out_spec if graph._codegen.pytree_info else None
        graph._codegen = fx.graph.CodeGen()  # flat inputs and outputs (the structure is known)
        for node in [n for n in graph.nodes if n.op == "placeholder" and n.args]:
            for user in list(node.users):  # fx's guard that the baked-in default holds
                if getattr(user.target, "__name__", "") == "_assert_is_none":
                    graph.erase_node(user)
            if not node.users:  # a baked-in default argument
                graph.erase_node(node)
        gm = fx.GraphModule(tracer.root, graph)
        x_slots = [("x", t) for t in x_types]
        # fx orders the remaining placeholders by parameter, then by relation
        order = [p.name for p in params if p.name in self.edge_data]
        data_slots = [("edge_data", (a, r)) for a in order for r in self.layout.relations]
        if self.dgl:
            return gm, [("graph", None), *x_slots, *data_slots], out_spec
        edge_slots = [("edges", r) for r in self.layout.relations]
        return gm, x_slots + edge_slots + data_slots, out_spec

    # ------------------------------------------------------------------ build
    def build(self) -> HomogeneousModel:
        gm, slots, out_spec = self._trace()
        x_ex = self.example[1] if self.dgl else self.example[0]

        def example(kind: str, k: Any) -> Any:
            if kind == "x":
                return x_ex[k]
            if kind == "graph":
                return self.example[0]
            if kind == "edge_data":
                return self.example_edge[k[0]][k[1]]
            return self.example[1][k]

        flat = [example(kind, k) for kind, k in slots]
        shapes = _Shapes(gm)
        with torch.no_grad():
            try:
                with zero_in_degree_allowed(self.model):
                    shapes.run(*flat)
            except Exception as err:
                raise _error(
                    f"{type(self.model).__name__} failed on a small typed graph of the store's "
                    f"types ({type(err).__name__}: {err})"
                ) from err
        self.shapes = shapes.shapes
        self.gm = gm
        self.x = self.g.placeholder("x")
        self.edge_index = self.g.placeholder("edge_index")
        self.edge_type = self.g.placeholder("edge_type")
        # the store's edge columns the model's edge data dicts read, as arguments the
        # engine serves by name (edge_attr: features, edge_weight: weights)
        self.edge_args = {
            column: self.g.placeholder(_EDGE_ARG[column])
            for column in sorted(set(self.edge_data.values()))
        }
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(slots):
            raise _error(
                f"{type(self.model).__name__}: traced {len(placeholders)} inputs for "
                f"{len(slots)} per-type features and relations"
            )
        for node, (kind, key) in zip(placeholders, slots, strict=True):
            if kind == "x":
                self.values[node] = self._features(self.layout.index(key))
            elif kind == "graph":
                self.values[node] = _Value(None, kind="graph")
            elif kind == "edge_data":
                arg, rel = key
                payload = (self.edge_data[arg], tuple(rel))
                self.values[node] = _Value(None, kind="edge_data", payload=payload)
            else:
                self.values[node] = _Value(None, kind="edges", payload=key)
        self.joined = _to_hetero_layers(self) if _is_to_hetero(self.model) else {}
        absorbed = {n for j in self.joined.values() for n in j.absorbed}
        output = None
        for node in gm.graph.nodes:
            if node.op == "placeholder" or node in absorbed:
                continue
            if node.op == "output":
                output = node
                break
            if node in self.joined:
                self.values[node] = self._joined_layer(node)
                continue
            self.values[node] = self._node(node)
        assert output is not None
        result, types, dims = self._output(output, out_spec)
        self.g.output(result)
        hm = HomogeneousModel(self.root, self.g, f"{type(self.model).__name__}Homogeneous")
        hm.graph.eliminate_dead_code()
        hm.recompile()
        hm.layout = self.layout
        hm.output_types = tuple(self.layout.names[t] for t in types)
        hm.output_dims = dims
        return hm

    def _features(self, t: int) -> _Value:
        dim = self.layout.feature_dims[t]
        if dim == max(self.layout.feature_dims):
            return _Value(self.x, t)
        node = self._columns(self.x, dim)
        self.feature_slices.add(node)
        return _Value(node, t)

    def _columns(self, node: fx.Node, width: int) -> fx.Node:
        return self._emit(
            "call_function", operator.getitem, (node, (slice(None), slice(None, width))), {}
        )

    def _emit(self, op: str, target: Any, args: tuple, kwargs: dict) -> fx.Node:
        """Emit an op, once per identical call (target and arguments)."""
        key = f"{op}|{target!r}|{args!r}|{kwargs!r}"
        node = self.cse.get(key)
        if node is None:
            node = self.cse[key] = self.g.create_node(op, target, args, kwargs)
        return node

    def _where(self, node: fx.Node) -> str:
        from hopserve.worker.trace.tracer import source_line

        return source_line(node)

    def _node(self, node: fx.Node) -> _Value:
        if node.op == "get_attr":
            return _Value(self._emit("get_attr", f"model.{node.target}", (), {}))
        if node.op == "call_module":
            module = self.gm.get_submodule(str(node.target))
            hetero_cls = _hetero_conv_class()
            if hetero_cls is not None and isinstance(module, hetero_cls):
                return self._hetero(node, module)
            return self._module(node, module)
        if (
            node.op == "call_function"
            and node.target is operator.getitem
            and isinstance(node.args[0], fx.Node)
            and self.values[node.args[0]].kind == "hetero"
        ):
            return self._hetero_output(node)
        return self._function(node)

    def _map(self, node: fx.Node, types: set[int]) -> tuple[tuple, dict]:
        """The node's arguments in the homogeneous graph; collects their node types."""

        def one(a: fx.Node) -> fx.Node:
            v = self.values[a]
            if v.kind != "tensor":
                what = {
                    "edges": "an edge_index",
                    "graph": "the graph",
                    "edge_data": "per-relation edge data",
                }.get(v.kind, "a conv's output dict")
                raise _error(
                    f"'{node.name}' at {self._where(node)} uses {what} outside a "
                    "HeteroConv; only HeteroConv may read the graph"
                )
            if v.type_index is not None:
                types.add(v.type_index)
            return v.node

        return fx.node.map_arg(node.args, one), fx.node.map_arg(node.kwargs, one)

    def _one_type(self, node: fx.Node, types: set[int]) -> int | None:
        if len(types) > 1:
            names = sorted(self.layout.names[t] for t in types)
            raise _error(
                f"'{node.name}' at {self._where(node)} mixes the values of node types "
                f"{names}; per-type values are combined only by HeteroConv"
            )
        return next(iter(types), None)

    def _function(self, node: fx.Node) -> _Value:
        if (
            node.op == "call_method"
            and node.target == "local_var"
            and isinstance(node.args[0], fx.Node)
            and self._kind(node.args[0]) == "graph"
        ):
            return _Value(None, kind="graph")  # DGL's scratch copy: the same graph
        types: set[int] = set()
        args, kwargs = self._map(node, types)
        t = self._one_type(node, types)
        written = _written_argument(node)
        if written is None:
            return _Value(self._emit(node.op, node.target, args, kwargs), t)
        # A write into a value: its table may be other types' values too (a HeteroConv's
        # output, the feature table), and identical calls are merged, so the op runs out of
        # place and the user's value now reads the result.
        self._refuse_view_write(node, written)
        target, args, kwargs = _out_of_place(node, args, kwargs)
        value = _Value(self._emit(node.op, target, args, kwargs), t)
        self.values[written] = value
        return value

    def _refuse_view_write(self, node: fx.Node, written: fx.Node) -> None:
        """Refuse ``node`` writing in place into ``written`` when that may be a view of
        another value: run out of place, the write would not reach its base."""
        source = written.args[0] if written.args else None
        of_tensor = isinstance(source, fx.Node) and self._kind(source) == "tensor"
        if _is_view(written, of_tensor):
            raise _error(
                f"'{node.name}' at {self._where(node)} writes in place into a view of a value "
                f"('{written.name}'); write it out of place"
            )

    def _module(self, node: fx.Node, module: nn.Module) -> _Value:
        from hopserve.worker.convs.registry import is_conv_module

        if is_conv_module(module):
            if node.args and self._kind(node.args[0]) == "graph":
                return self._dgl_dict_conv(node, module)
            if node.args and isinstance(node.args[0], dict):
                return self._dict_conv(node, module)
            return self._relation_conv(node, module)
        types: set[int] = set()
        args, kwargs = self._map(node, types)
        t = self._one_type(node, types)
        in_place = bool(getattr(module, "inplace", False))
        hooked = bool(module._forward_hooks or module._forward_pre_hooks)
        if in_place and node.args and isinstance(node.args[0], fx.Node):
            self._refuse_view_write(node, node.args[0])
        if type(module) in ELEMENTWISE_MODULES and not in_place and not hooked:
            # Copies of one configuration (to_hetero's per-type copies) are one op too.
            config = (type(module), module.extra_repr(), module.training)
            key = f"elementwise|{config!r}|{args!r}|{kwargs!r}"
            if key not in self.cse:
                self.cse[key] = self._emit("call_module", f"model.{node.target}", args, kwargs)
            return _Value(self.cse[key], t)
        if t is None and in_place and node.args and isinstance(node.args[0], fx.Node):
            # A write: on a copy of the value (identical calls are merged, so its tensor
            # may be another value's too), each call its own op; the user's value reads
            # the result, as it would after the in-place call.
            copy = self.g.call_method("clone", (args[0],))
            target = f"model.{node.target}"
            value = _Value(self.g.call_module(target, (copy, *args[1:]), kwargs), t)
            self.values[node.args[0]] = value
            return value
        if t is None:
            return _Value(self._emit("call_module", f"model.{node.target}", args, kwargs), t)
        if len(args) != 1 or kwargs:
            raise _error(
                f"module '{node.target}' at {self._where(node)} takes several inputs; a "
                "per-type module of a dict model must take one tensor"
            )
        self.typed.append(TypedRows(module, t, self.layout))
        target = f"typed.{len(self.typed) - 1}"
        value = _Value(self.g.call_module(target, args), t)
        if in_place:  # on a copy of the type's rows; the user's value reads the result
            self.values[node.args[0]] = value
        return value

    def _hetero(self, node: fx.Node, conv: nn.Module) -> _Value:
        where = f"HeteroConv '{node.target}' at {self._where(node)}"
        if len(node.args) < 2:
            raise _error(f"{where} must be called as conv(x_dict, edge_index_dict, ...)")
        x_arg, edges_arg = node.args[:2]
        extra = [*node.args[2:], *node.kwargs.values()]
        if not isinstance(x_arg, dict) or not isinstance(edges_arg, dict):
            raise _error(f"{where} must be called with the per-type dicts themselves")
        if not all(isinstance(d, dict) for d in extra) or not all(
            k.endswith("_dict") for k in node.kwargs
        ):
            raise _error(
                f"{where}: its further arguments must be per-relation edge data dicts "
                "(edge_attr_dict, edge_weight_dict)"
            )
        if conv.aggr not in ("sum", "mean", "min", "max", "mul", "cat"):
            raise _error(
                f"{where} uses aggr={conv.aggr!r}; per-node outputs need sum, mean, min, "
                "max, mul or cat"
            )
        inputs = self._typed_inputs(x_arg, where)
        calls = []
        for key in conv.convs.keys():  # noqa: SIM118 - (src, name, dst) keys
            rel = self.layout.relation_id(key)
            if rel is None or key not in edges_arg:
                continue  # PyG skips relations the edge_index_dict lacks
            if self.values[edges_arg[key]].payload != tuple(key):
                raise _error(f"{where}: edge_index_dict[{key}] is not the graph's {key}")
            src, dst = self.layout.index(key[0]), self.layout.index(key[2])
            for end, t in (("source", src), ("destination", dst)):
                if t not in inputs:
                    raise _error(
                        f"{where}: relation {key} reads node type {self.layout.names[t]!r} "
                        f"({end}), which x_dict lacks here"
                    )
            _check_relation_conv(conv.convs[key], f"{node.target}.{'__'.join(key)}", where)
            args = [d[key] for d in node.args[2:] if key in d]
            kwargs = {k[: -len("_dict")]: d[key] for k, d in node.kwargs.items() if key in d}
            data = self._edge_data(conv.convs[key], key, args, kwargs, where)
            calls.append(RelationCall(tuple(key), rel, src, dst, data))
        used = sorted({c.src for c in calls} | {c.dst for c in calls})
        widths = {t: int(self.shapes[inputs[t]][-1]) for t in used}
        out_shapes = self.shapes.get(node, {})
        out_widths = {self.layout.index(k): tuple(s[1:]) for k, s in out_shapes.items()}
        convs = [conv.convs[c.key] for c in calls]
        out_width = _out_shape(out_widths, where)
        layer = HeteroLayer(convs, calls, conv.aggr, self.layout, widths, out_width)
        out = self._layer(layer, [self.values[inputs[t]].node for t in used], used)
        return _Value(out, kind="hetero", payload=(layer, out_widths))

    def _layer(self, layer: nn.Module, inputs: list[fx.Node], types: list[int]) -> fx.Node:
        """Call ``layer`` on its types' values (merged into one table where they differ),
        with the edge columns its relation convs read."""
        self.layers.append(layer)
        x_in = self._merged(inputs, types)
        target = f"hetero_layers.{len(self.layers) - 1}"
        columns = {c for call in getattr(layer, "calls", ()) for _, c in call.edge_data}
        columns |= {c for data in getattr(layer, "edge_data", {}).values() for _, c in data}
        kwargs = {_EDGE_ARG[c]: self.edge_args[c] for c in sorted(columns)}
        if "features" in columns:  # the width the engine checks the store's against
            layer.edge_dim = int(self.edge_columns["features"])
        return self.g.call_module(target, (x_in, self.edge_index, self.edge_type), kwargs)

    def _edge_data(
        self, conv: nn.Module, key: tuple, args: Sequence[Any], kwargs: dict[str, Any], where: str
    ) -> tuple[tuple[str, str], ...]:
        """``(conv parameter, edge column)`` of relation ``key``'s edge data: ``args``
        follow ``(x, edge_index)`` positionally, ``kwargs`` by name (each value one
        relation's rows of an edge data dict, the relation ``key``'s)."""
        try:
            names = list(inspect.signature(conv.forward).parameters)[2:]
        except (TypeError, ValueError):
            names = []
        given = list(zip(names, args, strict=False)) + list(kwargs.items())
        if len(args) > len(names):
            raise _error(f"{where}: relation {key}'s conv takes {len(names) + 2} arguments")
        out = []
        for param, value in given:
            v = self.values.get(value) if isinstance(value, fx.Node) else None
            if v is None or v.kind != "edge_data" or v.payload[1] != tuple(key):
                raise _error(
                    f"{where}: relation {key}'s argument '{param}' is not its rows of a "
                    "per-relation edge data dict (edge_attr_dict, edge_weight_dict)"
                )
            out.append((param, v.payload[0]))
        return tuple(out)

    def _relation_conv(self, node: fx.Node, conv: nn.Module) -> _Value:
        """One relation conv of a ``to_hetero`` model: ``conv((x_s, x_t), edge_index_r)`` or
        ``conv(x_t, edge_index_r)``, a one-relation :class:`HeteroLayer` (a conv whose
        output is not only joined with its destination type's others: see
        :func:`_to_hetero_layers`)."""
        call, inputs, widths = self._relation_parts(node, conv)
        types = sorted(inputs)
        out_width = tuple(self.shapes[node][1:])
        layer = HeteroLayer([conv], [call], "sum", self.layout, widths, out_width)
        return _Value(self._layer(layer, [inputs[t] for t in types], types), call.dst)

    def _relation_parts(
        self, node: fx.Node, conv: nn.Module
    ) -> tuple[RelationCall, dict[int, fx.Node], dict[int, int]]:
        """A relation conv call's relation, its input per node type (homogeneous nodes)
        and their widths, after checking the call (see :meth:`_relation_conv`)."""
        where = f"conv '{node.target}' at {self._where(node)}"
        if len(node.args) < 2:
            raise _error(f"{where} must be called as conv(x, edge_index, ...)")
        x_arg, edge_arg = node.args[:2]
        edges = self.values.get(edge_arg) if isinstance(edge_arg, fx.Node) else None
        if edges is None or edges.kind != "edges":
            raise _error(f"{where}: its graph argument is not one relation's edge_index")
        key = tuple(edges.payload)
        rel = self.layout.relation_id(key)
        src, dst = self.layout.index(key[0]), self.layout.index(key[2])
        pair = x_arg if isinstance(x_arg, (tuple, list)) else (x_arg, x_arg)
        if len(pair) != 2:
            raise _error(f"{where}: its input is not x or a pair (x_src, x_dst)")
        for end, t, a in (("source", src, pair[0]), ("destination", dst, pair[1])):
            v = self.values.get(a) if isinstance(a, fx.Node) else None
            if v is None or v.kind != "tensor" or v.type_index != t:
                raise _error(
                    f"{where}: its {end} input is not node type {self.layout.names[t]!r}'s value"
                )
        _check_relation_conv(conv, str(node.target), where)
        data = self._edge_data(conv, key, node.args[2:], dict(node.kwargs), where)
        call = RelationCall(key, rel, src, dst, data)
        widths = {t: int(self.shapes[a][-1]) for t, a in ((src, pair[0]), (dst, pair[1]))}
        inputs = {src: self.values[pair[0]].node, dst: self.values[pair[1]].node}
        return call, inputs, widths

    def _joined_layer(self, node: fx.Node) -> _Value:
        """A destination type's joined output of a ``to_hetero`` layer
        (:func:`_to_hetero_layers`): the first one met emits the layer, every relation
        conv of it in one :class:`HeteroLayer` with ``to_hetero``'s aggregation; each
        type's value is that one table (its first columns, when narrower)."""
        joined = self.joined[node]
        if joined.out is None:
            calls, convs, inputs, widths = [], [], {}, {}
            for leaf in joined.leaves:
                conv = self.gm.get_submodule(str(leaf.target))
                call, ins, w = self._relation_parts(leaf, conv)
                for t, a in ins.items():
                    if inputs.setdefault(t, a) is not a:  # fx arguments agreed; values too
                        raise _error(f"conv '{leaf.target}' reads another value of its type")
                calls.append(call)
                convs.append(conv)
                widths.update(w)
            where = f"to_hetero layer '{joined.name}'"
            out_widths = {t: tuple(self.shapes[r][1:]) for t, r in joined.roots.items()}
            out_shape = _out_shape(out_widths, where)
            layer = HeteroLayer(convs, calls, joined.aggr, self.layout, widths, out_shape)
            types = sorted(inputs)
            joined.out = self._layer(layer, [inputs[t] for t in types], types)
            joined.out_shape = out_shape
        t = next(t for t, r in joined.roots.items() if r is node)
        width = tuple(self.shapes[node][1:])
        if width == joined.out_shape:
            return _Value(joined.out, t)
        return _Value(self._columns(joined.out, width[0]), t)

    def _kind(self, a: Any) -> str | None:
        v = self.values.get(a) if isinstance(a, fx.Node) else None
        return None if v is None else v.kind

    def _dgl_dict_conv(self, node: fx.Node, conv: nn.Module) -> _Value:
        """DGL's ``HeteroGraphConv(graph, x_dict)``: a DGL-style :class:`DictConvLayer`."""
        name = type(conv).__name__
        where = f"conv '{node.target}' ({name}) at {self._where(node)}"
        if name != "HeteroGraphConv":
            raise _error(
                f"{where} takes the heterograph; hopserve serves DGL's HeteroGraphConv only"
            )
        args = dict(zip(("graph", "inputs", "mod_args", "mod_kwargs"), node.args, strict=False))
        args.update(node.kwargs)
        if args.get("mod_args") is not None or not isinstance(args.get("inputs"), dict):
            raise _error(
                f"{where} must be called as conv(graph, x_dict[, mod_kwargs={{etype: "
                "{param: edge_data_dict[relation]}}]) (no mod_args, no (src, dst) pair of "
                "dicts)"
            )
        for rel, mod in conv.mods.items():
            _check_dgl_relation_conv(mod, f"{node.target}.{rel}", where)
        edge_data, params = self._dgl_edge_data(args.get("mod_kwargs"), where)
        inputs = self._typed_inputs(args["inputs"], where)
        types = sorted(inputs)
        widths = {t: int(self.shapes[inputs[t]][-1]) for t in types}
        out_widths = {
            self.layout.index(k): tuple(s[1:]) for k, s in self.shapes.get(node, {}).items()
        }
        relations = [(k, rel) for k, rel in enumerate(self.layout.relations)]
        layer = DictConvLayer(
            conv, self.layout, relations, widths, _out_shape(out_widths, where), style="dgl"
        )
        layer.edge_data = edge_data
        if params:
            fn = self._parameter_function([node for _, _, node in params])
            layer.param_kwargs = ParamKwargs(fn, [(etype, param) for etype, param, _ in params])
        out = self._layer(layer, [self.values[inputs[t]].node for t in types], types)
        return _Value(out, kind="hetero", payload=(layer, out_widths))

    def _dgl_edge_data(
        self, mod_kwargs: Any, where: str
    ) -> tuple[dict[str, tuple[tuple[str, str], ...]], list[tuple[str, str, fx.Node]]]:
        """``HeteroGraphConv``'s ``mod_kwargs`` as ``{etype: ((conv parameter, edge
        column), ...)}``, each value its relation's rows of a per-relation edge data dict
        (``edge_weight_dict[(src, etype, dst)]``), and ``[(etype, conv parameter, node)]``
        of the values computed from parameters only (per-relation weights)."""
        if mod_kwargs is None:
            return {}, []
        if not isinstance(mod_kwargs, dict):
            raise _error(f"{where}: its mod_kwargs must be a dict {{etype: {{param: value}}}}")
        names = {k[1]: k for k in self.layout.relations}
        counts = Counter(k[1] for k in self.layout.relations)
        shared = sorted(n for n, c in counts.items() if c > 1)
        if shared:
            raise _error(
                f"{where}: mod_kwargs are keyed by etype, and etype {shared[0]!r} names several "
                f"relations ({', '.join(str(k) for k in self.layout.relations if k[1] == shared[0])}"
                "); give each relation its own etype name"
            )
        out, params = {}, []
        for etype, kw in mod_kwargs.items():
            if etype not in names or not isinstance(kw, dict):
                raise _error(
                    f"{where}: mod_kwargs[{etype!r}] is not a relation's {{param: value}} "
                    f"(relations: {', '.join(sorted(names))})"
                )
            data = []
            for param, value in kw.items():
                if isinstance(value, fx.Node) and parameter_only(value):
                    from hopserve.worker.trace.tracer import edge_column

                    if edge_column(param) is None:  # a weight, not per-edge data
                        params.append((etype, param, value))
                        continue
                v = self.values.get(value) if isinstance(value, fx.Node) else None
                if v is None or v.kind != "edge_data" or v.payload[1] != names[etype]:
                    raise _error(
                        f"{where}: mod_kwargs[{etype!r}][{param!r}] is not relation "
                        f"{names[etype]}'s rows of a per-relation edge data dict "
                        "(edge_weight_dict, edge_attr_dict)"
                    )
                data.append((param, v.payload[0]))
            if data:
                out[etype] = tuple(data)
        return out, params

    def _parameter_function(self, nodes: list[fx.Node]) -> fx.GraphModule:
        """A graph module without inputs computing ``nodes`` (parameter-only values of the
        traced model) from the model's own parameters (shared, not copied)."""
        needed: set[fx.Node] = set()
        todo = list(nodes)
        while todo:
            n = todo.pop()
            if n not in needed:
                needed.add(n)
                todo.extend(n.all_input_nodes)
        graph, env = fx.Graph(), {}
        for n in self.gm.graph.nodes:
            if n in needed:
                env[n] = graph.node_copy(n, env.__getitem__)
        graph.output(tuple(env[n] for n in nodes))
        return fx.GraphModule(self.gm, graph)

    def _typed_inputs(self, x_arg: dict, where: str) -> dict[int, fx.Node]:
        inputs: dict[int, fx.Node] = {}
        for key, value in x_arg.items():
            v = self.values.get(value) if isinstance(value, fx.Node) else None
            if v is None or v.kind != "tensor" or v.type_index != self.layout.index(key):
                raise _error(f"{where}: x_dict[{key!r}] is not node type {key!r}'s value")
            inputs[v.type_index] = value
        return inputs

    def _dict_conv(self, node: fx.Node, conv: nn.Module) -> _Value:
        """A conv taking per-type dicts itself: a :class:`DictConvLayer` (``HGTConv``)."""
        name = type(conv).__name__
        where = f"conv '{node.target}' ({name}) at {self._where(node)}"
        if name not in DICT_CONVS:
            reason = DICT_CONV_REFUSALS.get(
                name,
                "hopserve serves the dict convs HeteroConv and "
                f"{', '.join(sorted(DICT_CONVS))}, whose output for a node reads its in-edges only",
            )
            raise _error(
                f"{where} takes per-type dicts and cannot be evaluated layer by layer: {reason}"
            )
        if len(node.args) != 2 or node.kwargs or not isinstance(node.args[1], dict):
            raise _error(f"{where} must be called as conv(x_dict, edge_index_dict)")
        x_arg, edges_arg = node.args
        inputs = self._typed_inputs(x_arg, where)
        relations = []
        for key, value in edges_arg.items():
            v = self.values.get(value) if isinstance(value, fx.Node) else None
            if v is None or v.kind != "edges" or v.payload != tuple(key):
                raise _error(f"{where}: edge_index_dict[{key}] is not the graph's {key}")
            relations.append((self.layout.relation_id(key), tuple(key)))
        types = sorted(inputs)
        widths = {t: int(self.shapes[inputs[t]][-1]) for t in types}
        out_widths = {
            self.layout.index(k): tuple(s[1:]) for k, s in self.shapes.get(node, {}).items()
        }
        layer = DictConvLayer(conv, self.layout, relations, widths, _out_shape(out_widths, where))
        out = self._layer(layer, [self.values[inputs[t]].node for t in types], types)
        return _Value(out, kind="hetero", payload=(layer, out_widths))

    def _merged(self, nodes: list[fx.Node], types: list[int]) -> fx.Node:
        if not nodes:
            return self.x
        if all(n is nodes[0] for n in nodes):
            return nodes[0]
        if all(n is self.x or n in self.feature_slices for n in nodes):
            return self.x  # each type's features are its columns of the zero-padded table
        key = f"merge|{types}|{nodes}"
        if key not in self.cse:
            self.typed.append(TypedMerge(types, self.layout))
            self.cse[key] = self.g.call_module(f"typed.{len(self.typed) - 1}", tuple(nodes))
        return self.cse[key]

    def _hetero_output(self, node: fx.Node) -> _Value:
        src = self.values[node.args[0]]
        layer, widths = src.payload
        name = node.args[1]
        t = self.layout.index(name)
        if t not in widths:
            raise _error(
                f"'{node.name}' at {self._where(node)} reads node type {name!r}, which no "
                "relation of the HeteroConv reaches"
            )
        if widths[t] == layer.out_shape:
            return _Value(src.node, t)
        return _Value(self._columns(src.node, widths[t][0]), t)

    def _output(self, output: fx.Node, out_spec: Any) -> tuple[fx.Node, list[int], tuple[int, ...]]:
        """The homogeneous output, its node types and each one's per-row width (of the
        traced value on the example graph)."""
        flat = (
            list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        )
        structure = pytree.tree_unflatten(flat, out_spec) if out_spec is not None else flat[0]
        name = type(self.model).__name__
        if isinstance(structure, fx.Node):
            v = self.values[structure]
            if v.kind != "tensor" or v.type_index is None:
                raise _error(f"{name} must return one node type's embeddings or a dict of them")
            return v.node, [v.type_index], (self._row_width(structure),)
        if isinstance(structure, dict):
            types, nodes = [], []
            for key, value in structure.items():
                v = self.values[value] if isinstance(value, fx.Node) else None
                if v is None or v.kind != "tensor" or v.type_index != self.layout.index(key):
                    raise _error(f"{name}'s output [{key!r}] is not node type {key!r}'s value")
                types.append(v.type_index)
                nodes.append(v.node)
            dims = tuple(self._row_width(value) for value in structure.values())
            return self._merged(nodes, types), types, dims
        raise _error(
            f"{name} returns a {type(structure).__name__}; a dict model must return one node "
            "type's embeddings or a dict of them"
        )

    def _row_width(self, node: fx.Node) -> int:
        """Values per row of a traced tensor (its shape on the example graph, rows aside)."""
        return int(math.prod(self.shapes[node][1:]))


_JOINS = {torch.add: "sum", torch.max: "max"}
"""The pairwise ops ``to_hetero`` joins a destination type's relation outputs with (its
``"mean"`` is the ``torch.add`` tree divided by the count)."""


class _Joined:
    """One ``to_hetero`` layer (the relation convs of one module of the original model):
    its relation conv calls, each destination type's join root, the aggregation, and
    every dict-graph node the one :class:`HeteroLayer` stands for."""

    def __init__(self, name: str, leaves: list[fx.Node], roots: dict[int, fx.Node], aggr: str,
                 absorbed: set[fx.Node]) -> None:  # fmt: skip
        self.name, self.leaves, self.roots, self.aggr = name, leaves, roots, aggr
        self.absorbed = absorbed
        self.out: fx.Node | None = None  # the layer's call, once emitted
        self.out_shape: tuple[int, ...] = ()


def _to_hetero_layers(builder: _Builder) -> dict[fx.Node, _Joined]:
    """``to_hetero``'s layers whose relation convs feed only their destination type's join:
    root node (a type's joined value) -> its layer.

    ``to_hetero`` calls a copy of a conv per relation (``conv.<src>__<rel>__<dst>``), then
    joins each destination type's outputs pairwise (``torch.add``, ``torch.max``; ``mean``
    divides the sum by the count). Run as written, every relation output is a table of its
    own, so a layer keeps one table per relation and reads the batch's edges once per
    relation; as one :class:`HeteroLayer` (``HeteroConv``'s aggregation) the layer is one
    table and one pass. A layer is joined only when the pattern is exactly that: each
    relation output used once, by its type's join; every join used once, inside it (a mean's
    sum by its division by the count); one input value per node type. Otherwise it runs as
    written (still exact).
    """
    from hopserve.worker.convs.registry import is_conv_module

    gm, values = builder.gm, builder.values
    layers: dict[str, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or len(node.args) < 2:
            continue
        edges = values.get(node.args[1]) if isinstance(node.args[1], fx.Node) else None
        if edges is None or edges.kind != "edges":
            continue
        if is_conv_module(gm.get_submodule(str(node.target))):
            layers.setdefault(str(node.target).rpartition(".")[0], []).append(node)
    out: dict[fx.Node, _Joined] = {}
    for name, leaves in layers.items():
        joined = _joined(name, leaves, builder)
        if joined is not None:
            out.update(dict.fromkeys(joined.roots.values(), joined))
    return out


def _joined(name: str, leaves: list[fx.Node], builder: _Builder) -> _Joined | None:
    """The :class:`_Joined` of one ``to_hetero`` layer's relation convs, or ``None`` when
    they are not only joined per destination type (see :func:`_to_hetero_layers`)."""
    by_dst: dict[int, list[fx.Node]] = {}
    per_type: dict[int, fx.Node] = {}
    for leaf in leaves:
        key = tuple(builder.values[leaf.args[1]].payload)
        src, dst = builder.layout.index(key[0]), builder.layout.index(key[2])
        x_arg = leaf.args[0]
        pair = x_arg if isinstance(x_arg, (tuple, list)) else (x_arg, x_arg)
        if len(pair) != 2:
            return None
        for t, a in ((src, pair[0]), (dst, pair[1])):
            if per_type.setdefault(t, a) is not a:
                return None
        by_dst.setdefault(dst, []).append(leaf)
    roots: dict[int, fx.Node] = {}
    absorbed: set[fx.Node] = set()
    aggrs: set[str] = set()
    for t, group in by_dst.items():
        if len(group) == 1:
            roots[t] = group[0]
            continue
        tree = _join_tree(group)
        if tree is None:
            return None
        root, inner, aggr = tree
        roots[t] = root
        absorbed |= inner
        aggrs.add(aggr)
    if len(aggrs) > 1 or len(leaves) == 1:
        return None
    return _Joined(name, leaves, roots, aggrs.pop() if aggrs else "sum", absorbed)


def _join_tree(leaves: list[fx.Node]) -> tuple[fx.Node, set[fx.Node], str] | None:
    """``(root, inner nodes, aggregation)`` when ``leaves`` are used only by one binary
    join tree of one op (every node of it used once, by the next join, whose two arguments
    are both in the tree; ``mean``: the sum's one user is its division by
    ``len(leaves)``), else ``None``. A join that also reads another value (a residual
    ``torch.add(joined, x)``) is not part of the tree: the climb stops below it."""
    members, joins, target = set(leaves), set(), None
    grown = True
    while grown:
        grown = False
        for node in list(members):
            join = next(iter(node.users)) if len(node.users) == 1 else None
            if (
                join is None
                or join in joins
                or join.op != "call_function"
                or join.target not in _JOINS
                or len(join.args) != 2
                or join.kwargs
                or not all(a in members for a in join.args)
                or (target is not None and join.target is not target)
            ):
                continue
            target = join.target
            joins.add(join)
            members.add(join)
            grown = True
    if target is None or len(joins) != len(leaves) - 1:
        return None
    ends = [n for n in members if len(n.users) != 1 or next(iter(n.users)) not in joins]
    if len(ends) != 1 or ends[0] not in joins:
        return None  # a relation output used elsewhere, or two trees
    root = ends[0]
    aggr = _JOINS[target]
    user = next(iter(root.users)) if len(root.users) == 1 else None
    if (
        aggr == "sum"
        and user is not None
        and user.op == "call_function"
        and user.target is torch.div
        and user.args == (root, len(leaves))
        and not user.kwargs
    ):
        return user, members, "mean"  # to_hetero's mean: the sum divided by the count
    return root, members - {root}, aggr


def _out_shape(shapes: dict[int, tuple[int, ...]], where: str) -> tuple[int, ...]:
    """One table's per-row shape for a conv's per-type outputs: their shape when they
    agree, else the widest of 2-D outputs (narrower types zero-padded)."""
    distinct = set(shapes.values())
    if len(distinct) <= 1:
        return next(iter(distinct), (1,))
    if all(len(s) == 1 for s in distinct):
        return (max(s[0] for s in distinct),)
    raise _error(f"{where}: its per-type outputs have different shapes {sorted(distinct)}")


def _heterograph(layout: TypeLayout, edges: dict[tuple, Tensor]) -> Any:
    """The example graph as a DGL heterograph (5 nodes a type)."""
    import dgl

    device = next(iter(edges.values())).device if edges else torch.device("cpu")
    return dgl.heterograph(
        {k: (e[0], e[1]) for k, e in edges.items()},
        num_nodes_dict=dict.fromkeys(layout.names, 5),
        device=device,
    )


def _check_dgl_relation_conv(conv: nn.Module, qualname: str, where: str) -> None:
    """A DGL relation conv must read its destinations' in-edges only: an ``exact`` conv of
    the support matrix, or ``GraphConv`` without source-degree norms (norm right/none)."""
    from hopserve.worker.convs.registry import conv_status

    name = type(conv).__name__
    if name == "GraphConv" and getattr(conv, "_norm", None) in ("right", "none"):
        return
    if conv_status(conv) != "exact":
        raise _error(
            f"{where}: relation conv '{qualname}' ({name}) is not exact on a relation's "
            "in-edges alone (it needs a whole-graph statistic, e.g. GraphConv's norm='both' "
            "source degrees, or is not a 1-hop conv); use norm='right' or a conv that "
            "aggregates in-neighbours only (SAGEConv, GATConv, ...)"
        )


def _check_relation_conv(conv: nn.Module, qualname: str, where: str) -> None:
    """A relation conv must be exact on a batch as it is (no whole-graph statistic)."""
    from hopserve.worker.convs.base import UnsupportedConvError
    from hopserve.worker.convs.message_passing import MessagePassingAdapter
    from hopserve.worker.convs.registry import adapter_for

    try:
        adapter = adapter_for(conv, qualname)
    except UnsupportedConvError as err:
        raise _error(f"{where}: {err}") from err
    if not isinstance(adapter, MessagePassingAdapter):  # GAT's: exact on any batch too
        raise _error(
            f"{where}: relation conv '{qualname}' ({type(conv).__name__}) needs a "
            "whole-graph statistic, which a relation of a HeteroConv cannot take yet; use "
            "a conv that aggregates in-neighbours only (SAGEConv, GraphConv, GATConv, ...)"
        )


def as_homogeneous(model: nn.Module, graph: Any) -> nn.Module:
    """``model`` as the engine splits it on ``graph``: a dict model rebuilt over the typed
    store's homogeneous form, any other model as it is.

    Raises:
        ModelTraceError: a dict model on an untyped store, or one :func:`homogenize`
            refuses.
    """
    if not is_dict_model(model) or isinstance(model, HomogeneousModel):
        return model
    layout = TypeLayout.from_graph(graph)
    if layout is None:
        raise _error(
            f"{type(model).__name__}.forward takes per-type dicts, but the graph has no node "
            "types; build a typed store (GraphStore.from_pyg(HeteroData), from_hetero, "
            "hopserve ingest-typed)"
        )
    columns = {}
    features = getattr(graph, "edge_features", None)
    if features is not None:
        columns["features"] = int(features.shape[1])
    if getattr(graph, "edge_weight", None) is not None:
        columns["weight"] = 1
    return homogenize(model, layout, columns)
