"""ConvBlocks: per-layer GraphModules generated from the traced model, plus their schema.

``split_model`` = trace → probe run (which values are per-node tensors) → partition
(:mod:`.splitter`) → one ``fx.GraphModule`` per block. A block's module is called as
``module(block, *inputs) -> tuple(outputs)``: ``block`` is a
:class:`~hopserve.worker.convs.Block`, each input holds rows ``block.src_nodes`` or
``block.dst_nodes`` (see :class:`BlockInput`), every output holds ``block.dst_nodes``
rows. Block modules share the user's parameters; nothing is copied.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import Tensor, fx, nn

from hopserve.worker.convs.base import (
    Block,
    ConvAdapter,
    UnsupportedConvError,
    fresh_conv_caches,
)
from hopserve.worker.convs.registry import NODEWISE_ADVICE, adapter_for
from hopserve.worker.trace.splitter import DST, SRC, NodeFacts, partition
from hopserve.worker.trace.tracer import ModelTraceError, TracedModel, source_line, trace_model

FEATURES = -1  # producer id of the raw node features (the graph store)


def dst_rows(t: Tensor, block: Block) -> Tensor:
    """The destination rows of a source-row tensor (see :meth:`Block.dst_rows`)."""
    return block.dst_rows(t)


@dataclass
class BlockInput:
    """One tensor a block reads: which value, which block stored it, which rows."""

    name: str  # value key (fx node name of the producer)
    producer: int  # block index that stores it; FEATURES = the graph store's features
    rows: str  # "src": all source rows of a batch; "dst": destination rows only
    # Convs reading it over source rows, when only convs do (else None): such inputs can
    # be handed over whole, without a gather, to adapters that support it.
    src_convs: tuple[str, ...] | None = None


@dataclass
class ConvBlock:
    """One layer of the model as a standalone module (DGI's ConvBlock)."""

    index: int  # 0 = node-wise pre-block (ops before the first conv), 1..L = layers
    module: fx.GraphModule
    inputs: list[BlockInput]
    outputs: list[str]
    convs: list[str]  # qualified names of the convs it runs

    @property
    def has_edges(self) -> bool:
        return self.index > 0


@dataclass
class ModelSplit:
    """The schema: blocks in execution order, the model output, and value lifetimes."""

    blocks: list[ConvBlock]
    output: str
    num_layers: int
    adapters: dict[str, ConvAdapter] = field(default_factory=dict)
    last_use: dict[str, int] = field(default_factory=dict)  # value -> last block reading it
    style: str = "pyg"

    def describe(self) -> str:
        """Human-readable schema, one line per block."""
        lines = []
        for b in self.blocks:
            ins = ", ".join(
                f"{i.name}@{'x' if i.producer == FEATURES else i.producer}[{i.rows}]"
                for i in b.inputs
            )
            lines.append(
                f"block {b.index}: convs={b.convs or '-'} inputs=({ins}) outputs={b.outputs}"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- probe
def probe_graph(num_nodes: int = 41, seed: int = 7) -> Tensor:
    """A small random edge_index with self-loops, duplicates and isolated nodes."""
    gen = torch.Generator().manual_seed(seed)
    active = num_nodes - 4  # the last 4 nodes are isolated
    e = 5 * num_nodes
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


def call_model(model: nn.Module, style: str, x: Tensor, edge_index: Tensor) -> Tensor:
    """The model's own full-graph forward on ``(x, edge_index)``, in its calling style."""
    graph = model_graph(style, edge_index, x.shape[0])
    return model(graph, x) if style == "dgl" else model(x, graph)


def probe_edge_index(model: nn.Module, style: str) -> tuple[Tensor, int]:
    """The probe graph for ``model`` and its node count.

    DGL convs built with ``allow_zero_in_degree=False`` raise on nodes without in-edges,
    so for them every such probe node gets a self-loop (what DGL users add themselves).
    DGL probe edges are listed by (destination, source): DGL's UDF reducers (e.g. the LSTM
    aggregator) read messages in edge-id order, which is then the store's CSC order.
    """
    ei = probe_graph()
    n = int(ei.max()) + 5
    if style != "dgl":
        return ei, n
    if any(getattr(m, "_allow_zero_in_degree", True) is False for m in model.modules()):
        lonely = torch.ones(n, dtype=torch.bool)
        lonely[ei[1]] = False
        loops = lonely.nonzero().squeeze(1)
        ei = torch.cat([ei, torch.stack([loops, loops])], dim=1)
    return ei[:, torch.argsort(ei[1] * n + ei[0], stable=True)], n


def _probe(
    traced: TracedModel, x: Tensor, edge_index: Tensor
) -> tuple[dict[fx.Node, NodeFacts], Tensor]:
    """Run the traced model once, recording which values are per-node tensors."""
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
        out = Recorder(traced.gm).run(*_ordered_inputs(traced, x, graph))
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


def _ordered_inputs(traced: TracedModel, x: Tensor, graph: object) -> list[object]:
    names = [n.target for n in traced.gm.graph.nodes if n.op == "placeholder"]
    by_name = {traced.feature_arg: x, traced.graph_arg: graph}
    return [by_name[name] for name in names if name in by_name]


# --------------------------------------------------------------------------- codegen
def _conv_x_arg(traced: TracedModel, node: fx.Node) -> fx.Node:
    """The feature argument of a conv call; refuse extra tensor arguments."""
    module = traced.conv_module(node)
    sig = inspect.signature(module.forward)
    try:
        bound = sig.bind(*node.args, **node.kwargs)
    except TypeError as err:
        raise ModelTraceError(f"conv '{node.target}' at {source_line(node)}: {err}") from err
    # The graph argument may come first (DGL: ``conv(graph, h)``) or second (PyG).
    params = [
        (name, val)
        for name, val in bound.arguments.items()
        if not (
            isinstance(val, fx.Node) and val.op == "placeholder" and val.target == traced.graph_arg
        )
    ]
    if not params:
        raise ModelTraceError(f"conv '{node.target}' at {source_line(node)} has no input")
    x_name, x_val = params[0]
    for name, val in params[1:]:
        is_graph = isinstance(val, fx.Node) and val.op == "placeholder"
        if is_graph or val is None or val is sig.parameters[name].default:
            continue
        raise ModelTraceError(
            f"conv '{node.target}' at {source_line(node)} is called with argument "
            f"'{name}'; only (x, edge_index) calls are supported (edge features are not yet)"
        )
    if not isinstance(x_val, fx.Node):
        raise ModelTraceError(
            f"conv '{node.target}' at {source_line(node)}: its input '{x_name}' must be one "
            "tensor (pair inputs are built by the engine)"
        )
    return x_val


def _build_blocks(traced: TracedModel, facts: dict[fx.Node, NodeFacts]) -> ModelSplit:
    graph = traced.gm.graph
    feature_node = next(
        n for n in graph.nodes if n.op == "placeholder" and n.target == traced.feature_arg
    )
    conv_nodes = set(traced.conv_nodes)
    part = partition(graph, feature_node, conv_nodes, facts)
    output = next(n for n in graph.nodes if n.op == "output")
    out_value = output.args[0]
    assert isinstance(out_value, fx.Node)

    # One adapter per conv *module* (weight sharing across layers keeps one adapter).
    root = nn.Module()
    root.add_module("model", traced.gm)
    adapters = nn.ModuleDict()
    adapter_names: dict[str, str] = {}
    conv_x: dict[fx.Node, fx.Node] = {}
    for c in traced.conv_nodes:
        conv_x[c] = _conv_x_arg(traced, c)
        qual = str(c.target)
        if qual not in adapter_names:
            name = f"a{len(adapter_names)}"
            try:
                adapters[name] = adapter_for(traced.conv_module(c), qual)
            except UnsupportedConvError as err:
                raise ModelTraceError(f"{err} (used at {source_line(c)})") from err
            adapter_names[qual] = name
    root.add_module("adapters", adapters)

    feature_order = [n for n in graph.nodes if n in part.block_of and n.op != "output"]
    num_blocks = part.num_layers + 1
    blocks: list[ConvBlock] = []
    last_use: dict[str, int] = {}
    for m in range(num_blocks):
        members = [n for n in feature_order if part.block_of[n] == m and n is not feature_node]
        if not members:
            continue
        gen = _BlockCodegen(m, members, part, facts, conv_nodes, conv_x, adapter_names)
        inputs = gen.add_inputs(feature_order, feature_node, output)
        for spec in inputs:
            last_use[spec.name] = m
        convs = gen.add_members()
        gen.conv_only_readers(inputs)
        outs = [
            n
            for n in members
            if n is out_value
            or any(part.block_of.get(u, -2) > m for u in n.users if u is not output)
        ]
        gm = gen.finish(root, outs)
        blocks.append(ConvBlock(m, gm, inputs, [n.name for n in outs], convs))

    split = ModelSplit(
        blocks=blocks,
        output=out_value.name,
        num_layers=part.num_layers,
        adapters={q: adapters[a] for q, a in adapter_names.items()},
        last_use=last_use,
        style=traced.style,
    )
    split.last_use[out_value.name] = num_blocks
    return split


class _BlockCodegen:
    """Emits one block's fx graph: inputs, copied ops, adapters for convs, dst slices."""

    def __init__(self, index, members, part, facts, conv_nodes, conv_x, adapter_names) -> None:
        self.index = index
        self.members = members
        self.member_set = set(members)
        self.part = part
        self.facts = facts
        self.conv_nodes = conv_nodes
        self.conv_x = conv_x
        self.adapter_names = adapter_names
        self.g = fx.Graph()
        self.blk = self.g.placeholder("block")
        self.env: dict[fx.Node, fx.Node] = {}
        self.sliced: dict[fx.Node, fx.Node] = {}
        self.consts: dict[fx.Node, fx.Node] = {}
        self.input_rows: dict[str, str] = {}
        self.placeholders: list[fx.Node] = []

    def need(self, user: fx.Node) -> str:
        """Rows ``user`` reads its feature inputs on."""
        return SRC if user in self.conv_nodes else self.part.rows_of[user]

    def rows(self, value: fx.Node) -> str:
        if value in self.member_set:
            return self.part.rows_of[value]
        return self.input_rows[value.name]

    def add_inputs(self, order, feature_node, output) -> list[BlockInput]:
        """Placeholders for feature-dependent values produced outside this block."""
        inputs = []
        for n in order:
            if n in self.member_set or n is output:
                continue
            readers = [u for u in n.users if u in self.member_set]
            if not readers:
                continue
            if self.facts[n].bundle:
                raise ModelTraceError(
                    f"'{n.name}' at {source_line(n)} crosses layers but is "
                    "not a tensor; cannot store it between layers"
                )
            rows = SRC if any(self.need(u) == SRC for u in readers) else DST
            producer = FEATURES if n is feature_node else self.part.block_of[n]
            inputs.append(BlockInput(n.name, producer, rows))
            self.input_rows[n.name] = rows
            self.env[n] = self.g.placeholder(f"in_{n.name}")
            self.placeholders.append(self.env[n])
        return inputs

    def _copy(self, node: fx.Node, lookup) -> fx.Node:
        new = self.g.node_copy(node, lookup)
        if new.op in ("get_attr", "call_module"):
            new.target = f"model.{new.target}"
        return new

    def _const(self, a: fx.Node) -> fx.Node:
        if a not in self.consts:
            self.consts[a] = self._copy(a, self._const)
        return self.consts[a]

    def _arg(self, user: fx.Node, a: fx.Node) -> fx.Node:
        if a not in self.env:
            # The graph input (only convs take it) or a feature-independent constant.
            return self.blk if a.op == "placeholder" else self._const(a)
        if self.need(user) == DST and self.rows(a) == SRC and self.facts[a].row:
            if a not in self.sliced:
                self.sliced[a] = self.g.call_function(dst_rows, (self.env[a], self.blk))
            return self.sliced[a]
        return self.env[a]

    def add_members(self) -> list[str]:
        """Copy the block's ops in order; convs become adapter calls. Returns conv names."""
        convs = []
        for n in self.members:
            if n in self.conv_nodes:
                x_in = self._arg(n, self.conv_x[n])
                target = f"adapters.{self.adapter_names[str(n.target)]}"
                self.env[n] = self.g.call_module(target, (x_in, self.blk))
                convs.append(str(n.target))
            else:
                self.env[n] = self._copy(n, lambda a, n=n: self._arg(n, a))
        return convs

    def conv_only_readers(self, inputs: list[BlockInput]) -> None:
        """Fill ``src_convs`` of source-row inputs read over source rows by convs only."""
        adapter_to_conv = {f"adapters.{a}": q for q, a in self.adapter_names.items()}
        for spec, node in zip(inputs, self.placeholders, strict=True):
            if spec.rows != SRC:
                continue
            convs = []
            for user in node.users:
                if user.op == "call_module" and user.target in adapter_to_conv:
                    convs.append(adapter_to_conv[user.target])
                elif not (user.op == "call_function" and user.target is dst_rows):
                    break
            else:
                spec.src_convs = tuple(convs)

    def finish(self, root: nn.Module, outs: list[fx.Node]) -> fx.GraphModule:
        """Emit outputs (destination rows) and build the module over ``root``."""
        values = []
        for n in outs:
            v = self.env[n]
            if self.part.rows_of[n] == SRC:
                v = self.g.call_function(dst_rows, (v, self.blk))
            values.append(v)
        self.g.output(tuple(values))
        return fx.GraphModule(root, self.g, f"ConvBlock{self.index}")


def split_model(
    model: nn.Module, feature_dim: int, dtype: torch.dtype = torch.float32
) -> ModelSplit:
    """Trace ``model`` and split it into ConvBlocks.

    Args:
        model: the user's unmodified model (put in eval mode).
        feature_dim: width of the input node features (for the probe run).
        dtype: feature dtype fed to the model.

    Raises:
        ModelTraceError: naming the module or source line that prevents layer-wise
            evaluation.
    """
    traced = trace_model(model)
    ei, n = probe_edge_index(model, traced.style)
    x = torch.randn(n, feature_dim, generator=torch.Generator().manual_seed(3)).to(dtype)
    try:
        with fresh_conv_caches(model):
            facts, _ = _probe(traced, x, ei)
    except ModelTraceError:
        raise
    except Exception as err:
        mismatch = input_width_mismatch(traced, feature_dim)
        if mismatch is not None:
            raise FeatureWidthError(mismatch) from err
        raise ModelTraceError(
            f"{type(model).__name__} failed on a probe graph with {feature_dim}-dim features: "
            f"{type(err).__name__}: {err}"
        ) from err
    return _build_blocks(traced, facts)


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
    "FEATURES",
    "BlockInput",
    "ConvBlock",
    "FeatureWidthError",
    "ModelSplit",
    "call_model",
    "dst_rows",
    "model_graph",
    "probe_edge_index",
    "split_model",
]
