"""The sampling oracle: the model's own forward on the sampled computation graph.

For layer ``l`` with fanout ``f_l``, ``G_l`` is the graph in which *every* node keeps
exactly its sampled in-edges at layer ``l`` (``sample_in_edges``: the ``<= f_l`` in-edges
with the smallest hash of ``(seed, l, CSC position)``; ``-1`` = all). The model's own
forward, with every conv of layer ``l`` run on ``G_l`` (forward pre-hooks replace its graph
argument), gives the reference rows. Shared by the PyG and DGL suites through a
:class:`~support.exactness.Style`; importable without DGL.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.convs.base import fresh_conv_caches
from hopserve.worker.graph.planner import sample_in_edges
from support import assert_exact
from support.exactness import MEDIUM_TARGETS, PYG, Style, graphs


def sampled_edge_index(store: GraphStore, fanout: int, layer: int, seed: int) -> torch.Tensor:
    """``G_l`` as a ``[2, E_l]`` edge index in external node IDs (row 0 = source; the
    in-edges of each node in CSC order)."""
    topo = store.topology
    nodes = np.arange(store.num_nodes)
    local, pos = sample_in_edges(topo.indptr, nodes, fanout, layer, seed)
    src = topo.indices[pos].astype(np.int64)
    dst = np.repeat(nodes, np.diff(local))
    return torch.stack([store.to_external(src), store.to_external(dst)])


def conv_layers(ev: LayerwiseEvaluator) -> dict[str, list[int]]:
    """Qualified conv name -> the layers it runs at, in call order."""
    layers: dict[str, list[int]] = {}
    for block in ev.split.blocks:
        for name in block.convs:
            layers.setdefault(name, []).append(block.index)
    return layers


@contextmanager
def convs_on(
    model: nn.Module, layers: dict[str, list[int]], graph_of: dict[int, object], arg: int
) -> Iterator[None]:
    """Forward pre-hooks: a conv's call at layer ``l`` gets ``graph_of[l]`` as argument ``arg``
    (or as its ``edge_index`` argument, wherever its forward takes it, ``GCN2Conv(x, x_0,
    edge_index)``, by position or by name).

    A conv module shared across layers is called once per layer in order; calls are counted.
    """
    modules = dict(model.named_modules())
    handles = []
    for name, at in layers.items():
        calls = [0]
        params = list(inspect.signature(modules[name].forward).parameters)
        where = params.index("edge_index") if "edge_index" in params else arg

        def hook(module, args, kwargs, at=at, calls=calls, where=where):
            layer = at[calls[0] % len(at)]
            calls[0] += 1
            if "edge_index" in kwargs:  # passed by name
                return args, {**kwargs, "edge_index": graph_of[layer]}
            args = list(args)
            args[where] = graph_of[layer]
            return tuple(args), kwargs

        handles.append(modules[name].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def oracle(
    model: nn.Module,
    ev: LayerwiseEvaluator,
    store: GraphStore,
    x: torch.Tensor,
    fanouts: Sequence[int],
    seed: int,
    style: Style = PYG,
) -> torch.Tensor:
    """All rows of the model's forward with layer ``l``'s convs on ``G_l`` (external order)."""
    graphs = {
        layer: style.to_graph(sampled_edge_index(store, f, layer, seed), store.num_nodes)
        for layer, f in enumerate(fanouts, 1)
    }
    # The model is called on an empty graph: no conv may see the unsampled one.
    empty = style.to_graph(torch.empty(2, 0, dtype=torch.long), store.num_nodes)
    hooks = convs_on(model, conv_layers(ev), graphs, style.graph_arg)
    with torch.no_grad(), fresh_conv_caches(model), hooks:
        return style.call(model, empty, x)


def check(
    model, store, x, fanouts, seed, targets, what, ev=None, style: Style = PYG
) -> LayerwiseEvaluator:
    """Full and partial sampled evaluation equal the oracle; returns the evaluator."""
    ev = ev or LayerwiseEvaluator(
        model, store, init_batch_nodes=3, self_check=False, progress=False
    )
    fanouts = list(fanouts)[: ev.num_layers]
    want = oracle(model, ev, store, x, fanouts, seed, style)
    got = ev.evaluate(fanouts=fanouts, seed=seed)
    assert_exact(got, want, f"{what} full fanouts={fanouts} seed={seed}")
    if store.num_nodes > 1000:
        assert ev.last_stats.batches > 2 * ev.num_layers  # really batched
    got = ev.evaluate(targets=targets, fanouts=fanouts, seed=seed)
    assert_exact(got, want[targets], f"{what} partial fanouts={fanouts} seed={seed}")
    return ev


def sampled_cases(layers: int):
    """Random graphs (isolated nodes, self-loops, duplicates, sometimes a hub), ``layers``
    fanouts and a sampling seed: ``(edge_index, x, targets, reorder, fanouts, seed)``."""
    return graphs(hub=True, layers=layers)


def check_sampled_case(style: Style, model: nn.Module, case: tuple, what: str) -> None:
    """A :func:`sampled_cases` case: full and partial sampled evaluation equal the oracle."""
    edge_index, x, targets, reorder, fanouts, seed = case
    store = GraphStore.from_edge_index(edge_index, x, reorder=reorder)
    check(model, store, x, fanouts, seed, targets, what, style=style)


def check_medium_graph(
    style: Style, model: nn.Module, medium_graph: tuple, runs: Sequence[tuple], what: str
) -> None:
    """``medium_graph`` in batches of 61 nodes, a fresh evaluator per ``(fanouts, seed)`` of
    ``runs``: full and partial sampled evaluation equal the oracle."""
    edge_index, x, store = medium_graph
    targets = torch.tensor(MEDIUM_TARGETS)
    for fanouts, seed in runs:
        ev = LayerwiseEvaluator(model, store, init_batch_nodes=61, progress=False)
        check(model, store, x, fanouts, seed, targets, what, ev=ev, style=style)


def check_fanout_at_least_max_degree(
    model: nn.Module,
    medium_graph: tuple,
    fanout_lists: Callable[[int, int], Sequence[list[int]]],
    what: str,
) -> None:
    """Fanouts of at least the largest in-degree (``fanout_lists(max_degree, num_layers)``,
    cut to the model's layers) sample nothing: the rows equal exact evaluation."""
    _, _, store = medium_graph
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    max_deg = int(store.in_degrees.max())
    targets = torch.tensor([5, 2999, 1234, 5])
    want = ev.evaluate(targets=targets)
    for fanouts in fanout_lists(max_deg, ev.num_layers):
        fanouts = fanouts[: ev.num_layers]
        got = ev.evaluate(targets=targets, fanouts=fanouts, seed=9)
        assert_exact(got, want, f"{what} fanouts={fanouts}")


def check_alternating_seeds(
    style: Style, model: nn.Module, medium_graph: tuple, fanouts: list[int], what: str
) -> LayerwiseEvaluator:
    """Seeds 1, 2, 1, 2 in turn (through a sampled-statistics cache the caller shrinks):
    every evaluation equals the oracle. ``what`` is formatted with ``seed``."""
    edge_index, x, store = medium_graph
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=200, progress=False)
    targets = torch.tensor([3, 2999, 100, 2500])
    for seed in (1, 2, 1, 2):
        want = oracle(model, ev, store, x, fanouts, seed, style)[targets]
        got = ev.evaluate(targets=targets, fanouts=fanouts, seed=seed)
        assert_exact(got, want, what.format(seed=seed))
    return ev
