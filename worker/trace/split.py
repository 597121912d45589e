"""``split_model``: the user's model → ConvBlocks (DGI §3.1–3.2).

trace (:mod:`.tracer`) → probe run (:mod:`.probe`: which values are per-node tensors) →
partition (:mod:`.splitter`: which block each op runs in, on which rows) → code
generation here: one ``fx.GraphModule`` per block, with convs replaced by their adapters
(:mod:`hopserve.worker.convs`), described by the schema of :mod:`.blocks`.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, fx, nn

from hopserve.worker.convs.base import (
    EdgeInput,
    LayerBatch,
    UnsupportedConvError,
    fresh_conv_caches,
)
from hopserve.worker.convs.registry import NODEWISE_ADVICE, adapter_for
from hopserve.worker.hetero.layout import probe_relation_ids, probe_type_ranges
from hopserve.worker.trace.blocks import FEATURES, BlockInput, ConvBlock, ModelSplit, dst_rows
from hopserve.worker.trace.probe import (
    FeatureWidthError,
    edge_feature_width,
    input_width_mismatch,
    node_type_count,
    probe_edge_data,
    probe_edge_index,
    probe_facts,
    relation_count,
)
from hopserve.worker.trace.splitter import DST, SRC, ConvArgs, NodeFacts, partition
from hopserve.worker.trace.tracer import ModelTraceError, TracedModel, source_line, trace_model


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
    # Refuse unsupported convs before running anything: a conv that needs edge data or
    # another input would otherwise fail on the probe graph with an unrelated error.
    adapters, adapter_names, conv_args = _conv_adapters(traced)
    edge_dim, num_relations, num_node_types = _bind_edge_inputs(traced, adapters, adapter_names)
    ei, n = probe_edge_index(model, traced.style)
    x = torch.randn(n, feature_dim, generator=torch.Generator().manual_seed(3)).to(dtype)
    # The probe runs where the model's weights are (a worker moves it to its GPU first).
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    edge = probe_edge_data(
        traced.edge_args,
        ei,
        edge_dim,
        seed=5,
        num_relations=num_relations,
        num_nodes=n,
        num_node_types=num_node_types,
        relation_ids=probe_relation_ids(model, ei, n),
    )
    x, ei = x.to(device), ei.to(device)
    edge = {k: v.to(device) for k, v in edge.items()}
    try:
        with fresh_conv_caches(model), probe_type_ranges(model, n):
            facts, _ = probe_facts(traced, x, ei, edge)
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
    split = _build_blocks(traced, facts, adapters, adapter_names, conv_args)
    split.edge_args = dict(traced.edge_args)
    split.edge_feature_dim = edge_dim
    split.num_relations = num_relations
    split.num_node_types = num_node_types
    return split


def _conv_edge_inputs(traced: TracedModel, node: fx.Node) -> tuple[EdgeInput, ...]:
    """The edge data arguments of one conv call (model edge placeholders it receives)."""
    if not traced.edge_args:
        return ()
    module = traced.conv_module(node)
    bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
    out = []
    for name, val in bound.arguments.items():
        if isinstance(val, fx.Node) and val.op == "placeholder" and val.target in traced.edge_args:
            out.append(EdgeInput(name, str(val.target), traced.edge_args[str(val.target)]))
    return tuple(out)


def _bind_edge_inputs(
    traced: TracedModel, adapters: nn.ModuleDict, adapter_names: dict[str, str]
) -> tuple[int | None, int | None, int | None]:
    """Tell each adapter the edge data its conv's calls take (one set per conv module) and
    what the whole model takes; returns the edge feature width and the numbers of relations
    and of node types the convs expect (``None`` where no conv takes that column).

    Raises:
        ModelTraceError: a conv whose adapter cannot take edge data is called with it, or
            one conv module is called with different edge data, or the edge feature
            width cannot be told.
    """
    if not traced.edge_args:
        return None, None, None
    per_conv: dict[str, tuple[EdgeInput, ...]] = {}
    for c in traced.conv_nodes:
        qual = str(c.target)
        inputs = _conv_edge_inputs(traced, c)
        if per_conv.setdefault(qual, inputs) != inputs:
            raise ModelTraceError(
                f"conv '{qual}' at {source_line(c)} is called with other edge data than at "
                "its first call; one conv module must take the same edge data at every call"
            )
    model_name = type(traced.gm).__name__
    for qual, inputs in per_conv.items():
        adapter = adapters[adapter_names[qual]]
        if inputs and not adapter.accepts_edge_data:
            raise ModelTraceError(
                f"conv '{qual}' ({type(traced.gm.get_submodule(qual)).__name__}) is called "
                f"with edge data '{inputs[0].arg}', which hopserve cannot pass to it layer "
                f"by layer yet (docs/support_matrix.md). {NODEWISE_ADVICE}."
            )
        try:
            adapter.set_edge_inputs(inputs, traced.edge_args, model_name)
        except UnsupportedConvError as err:
            raise ModelTraceError(f"conv '{qual}': {err}") from err
    feature_convs = [
        (q, traced.gm.get_submodule(q))
        for q, inputs in per_conv.items()
        if any(i.column == "features" for i in inputs)
    ]
    edge_dim = edge_feature_width(feature_convs) if feature_convs else None
    type_convs = [
        (q, traced.gm.get_submodule(q))
        for q, inputs in per_conv.items()
        if any(i.column == "type" for i in inputs)
    ]
    num_relations = relation_count(type_convs) if type_convs else None
    node_type_convs = [
        (q, traced.gm.get_submodule(q))
        for q, inputs in per_conv.items()
        if any(i.column == "node_type" for i in inputs)
    ]
    num_node_types = node_type_count(node_type_convs) if node_type_convs else None
    for adapter in adapters.values():
        adapter.edge_feature_dim = edge_dim
        adapter.num_relations = num_relations
        adapter.num_node_types = num_node_types
    return edge_dim, num_relations, num_node_types


def _conv_adapters(
    traced: TracedModel,
) -> tuple[nn.ModuleDict, dict[str, str], dict[fx.Node, ConvArgs]]:
    """One adapter per conv *module* (weight sharing across layers keeps one adapter), the
    adapter name of each conv, and each conv call's per-node arguments.

    Raises:
        ModelTraceError: a conv the support matrix refuses, or a call with extra inputs
            its adapter does not take.
    """
    adapters = nn.ModuleDict()
    adapter_names: dict[str, str] = {}
    conv_args: dict[fx.Node, ConvArgs] = {}
    for c in traced.conv_nodes:
        qual = str(c.target)
        if qual not in adapter_names:
            name = f"a{len(adapter_names)}"
            try:
                adapters[name] = adapter_for(traced.conv_module(c), qual)
            except UnsupportedConvError as err:
                raise ModelTraceError(f"{err} (used at {source_line(c)})") from err
            adapter_names[qual] = name
        conv_args[c] = _conv_node_args(traced, c, adapters[adapter_names[qual]])
    return adapters, adapter_names, conv_args


def _conv_node_args(traced: TracedModel, node: fx.Node, adapter) -> ConvArgs:  # noqa: ANN001
    """The per-node arguments of a conv call; refuse tensor arguments its adapter does not
    take (edge data and the graph come from the store, not from here)."""
    module = traced.conv_module(node)
    sig = inspect.signature(module.forward)
    try:
        bound = sig.bind(*node.args, **node.kwargs)
    except TypeError as err:
        raise ModelTraceError(f"conv '{node.target}' at {source_line(node)}: {err}") from err
    store_inputs = {traced.graph_arg, *traced.edge_args}
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
    extra: dict[str, fx.Node] = {}
    for name, val in params[1:]:
        from_store = (
            isinstance(val, fx.Node) and val.op == "placeholder" and val.target in store_inputs
        )
        if from_store or val is None or val is sig.parameters[name].default:
            continue
        if name in adapter.node_inputs and isinstance(val, fx.Node):
            extra[name] = val
            continue
        takes = ", ".join(f"'{p}'" for p in adapter.node_inputs)
        raise ModelTraceError(
            f"conv '{node.target}' at {source_line(node)} is called with argument "
            f"'{name}'; only (x, edge_index) calls"
            + (f" with per-node {takes}" if takes else "")
            + ", with edge data from the model's edge_weight / edge_attr / edge_type "
            "arguments, are supported"
        )
    if not isinstance(x_val, fx.Node):
        raise ModelTraceError(
            f"conv '{node.target}' at {source_line(node)}: its input '{x_name}' must be one "
            "tensor (pair inputs are built by the engine)"
        )
    return ConvArgs(x_val, extra, {p: adapter.node_inputs[p] for p in extra})


def _build_blocks(
    traced: TracedModel,
    facts: dict[fx.Node, NodeFacts],
    adapters: nn.ModuleDict,
    adapter_names: dict[str, str],
    conv_args: dict[fx.Node, ConvArgs],
) -> ModelSplit:
    graph = traced.gm.graph
    feature_node = next(
        n for n in graph.nodes if n.op == "placeholder" and n.target == traced.feature_arg
    )
    typed_nodes = {
        n
        for n in graph.nodes
        if n.op == "call_module"
        and getattr(traced.gm.get_submodule(str(n.target)), "needs_node_ids", False)
    }
    _check_node_inputs(conv_args, facts)
    part = partition(graph, feature_node, conv_args, facts)
    output = next(n for n in graph.nodes if n.op == "output")
    out_value = output.args[0]
    assert isinstance(out_value, fx.Node)

    root = nn.Module()
    root.add_module("model", traced.gm)
    root.add_module("adapters", adapters)

    feature_order = [n for n in graph.nodes if n in part.block_of and n.op != "output"]
    num_blocks = part.num_layers + 1
    blocks: list[ConvBlock] = []
    last_use: dict[str, int] = {}
    for m in range(num_blocks):
        members = [n for n in feature_order if part.block_of[n] == m and n is not feature_node]
        if not members:
            continue
        gen = _BlockCodegen(m, members, part, facts, conv_args, adapter_names)
        gen.typed_nodes = typed_nodes
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


def _check_node_inputs(conv_args: dict[fx.Node, ConvArgs], facts: dict[fx.Node, NodeFacts]) -> None:
    """Refuse an extra conv input that is not one row per node (a constant, a tuple)."""
    for conv, args in conv_args.items():
        for param, value in args.extra.items():
            f = facts.get(value)
            if f is None or not f.row or f.bundle:
                raise ModelTraceError(
                    f"conv '{conv.target}' at {source_line(conv)}: its input '{param}' "
                    f"('{value.name}') must be a tensor with one row per node"
                )


def batch_row_ids(batch: LayerBatch, rows: str) -> Tensor | None:
    """Storage ids of a batch's ``rows`` (``"src"`` / ``"dst"``); ``None`` when they are the
    whole node table in storage order (global sources)."""
    if rows == DST:
        return batch.dst_nodes
    return None if batch.global_src_size is not None else batch.src_nodes


class _BlockCodegen:
    """Emits one block's fx graph: inputs, copied ops, adapters for convs, dst slices."""

    def __init__(self, index, members, part, facts, conv_args, adapter_names) -> None:
        self.index = index
        self.members = members
        self.member_set = set(members)
        self.part = part
        self.facts = facts
        self.conv_args = conv_args
        self.conv_nodes = set(conv_args)
        self.adapter_names = adapter_names
        self.g = fx.Graph()
        self.batch = self.g.placeholder("batch")
        self.env: dict[fx.Node, fx.Node] = {}
        self.sliced: dict[fx.Node, fx.Node] = {}
        self.consts: dict[fx.Node, fx.Node] = {}
        self.input_rows: dict[str, str] = {}
        self.placeholders: list[fx.Node] = []
        self.typed_nodes: set[fx.Node] = set()  # node-wise modules told their rows' ids
        self.row_ids: dict[str, fx.Node] = {}

    def need(self, user: fx.Node, value: fx.Node) -> str:
        """Rows ``user`` reads ``value`` on."""
        if user in self.conv_nodes:
            return self.conv_args[user].rows_of(value) or SRC
        return self.part.rows_of[user]

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
            rows = SRC if any(self.need(u, n) == SRC for u in readers) else DST
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

    def _arg(self, user: fx.Node, a: fx.Node, need: str | None = None) -> fx.Node:
        """``user``'s argument ``a``, on the rows ``user`` reads it on (``need``: the rows
        of one parameter, where ``user`` reads ``a`` through several)."""
        if a not in self.env:
            # The graph input (only convs take it) or a feature-independent constant.
            return self.batch if a.op == "placeholder" else self._const(a)
        need = need or self.need(user, a)
        if need == DST and self.rows(a) == SRC and self.facts[a].row:
            if a not in self.sliced:
                self.sliced[a] = self.g.call_function(dst_rows, (self.env[a], self.batch))
            return self.sliced[a]
        return self.env[a]

    def add_members(self) -> list[str]:
        """Copy the block's ops in order; convs become adapter calls. Returns conv names."""
        convs = []
        for n in self.members:
            if n in self.conv_nodes:
                args = self.conv_args[n]
                x_in = self._arg(n, args.x)
                extra = {p: self._arg(n, v, args.rows[p]) for p, v in args.extra.items()}
                target = f"adapters.{self.adapter_names[str(n.target)]}"
                self.env[n] = self.g.call_module(target, (x_in, self.batch), extra)
                convs.append(str(n.target))
            else:
                ids = self._row_ids(n) if n in self.typed_nodes else None
                self.env[n] = self._copy(n, lambda a, n=n: self._arg(n, a))
                if ids is not None:
                    self.env[n].kwargs = {**self.env[n].kwargs, "node_ids": ids}
        return convs

    def _row_ids(self, n: fx.Node) -> fx.Node:
        """Storage ids of the rows ``n`` runs on (for modules with ``needs_node_ids``)."""
        rows = self.part.rows_of[n]
        if rows not in self.row_ids:
            self.row_ids[rows] = self.g.create_node(
                "call_function", batch_row_ids, (self.batch, rows), name=f"ids_of_{rows}_rows"
            )
        return self.row_ids[rows]

    def conv_only_readers(self, inputs: list[BlockInput]) -> None:
        """Fill ``src_convs`` of source-row inputs read over source rows by convs only."""
        adapter_to_conv = {f"adapters.{a}": q for q, a in self.adapter_names.items()}
        for spec, node in zip(inputs, self.placeholders, strict=True):
            if spec.rows != SRC:
                continue
            convs = []
            for user in node.users:
                if node in user.kwargs.values():  # a conv's extra per-node input
                    break
                if user.op == "call_module" and user.target in adapter_to_conv:
                    convs.append(adapter_to_conv[user.target])
                elif user.op == "call_function" and user.target is dst_rows:
                    spec.read_on_dst = True
                else:
                    break
            else:
                spec.src_convs = tuple(convs)

    def finish(self, root: nn.Module, outs: list[fx.Node]) -> fx.GraphModule:
        """Emit outputs (destination rows) and build the module over ``root``."""
        values = []
        for n in outs:
            v = self.env[n]
            if self.part.rows_of[n] == SRC:
                v = self.g.call_function(dst_rows, (v, self.batch))
            values.append(v)
        self.g.output(tuple(values))
        return fx.GraphModule(root, self.g, f"ConvBlock{self.index}")


__all__ = ["split_model"]
