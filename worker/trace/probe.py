"""The probe run: the traced model on a small random graph, to learn what its values are.

Which fx values are per-node tensors (rows of the graph's nodes), which depend on the
features, which are constants: the facts the partition (:mod:`.splitter`) needs. Also the
model's own full-graph forward in its calling style (PyG ``model(x, edge_index)`` or DGL
``model(graph, x)``), used by the self-check, and the feature-width diagnosis.
"""

from __future__ import annotations

import torch
from torch import Tensor, fx, nn

from hopserve.worker.convs.registry import NODEWISE_ADVICE
from hopserve.worker.trace.splitter import NodeFacts
from hopserve.worker.trace.tracer import ModelTraceError, TracedModel, source_line


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


def probe_facts(
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
    "input_width_mismatch",
    "model_graph",
    "probe_edge_index",
    "probe_facts",
    "probe_graph",
]
