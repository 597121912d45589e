"""DGL models: sampling evaluation equals the model's own forward on the sampled graphs.

The oracle (as in tests/worker/engine/test_sampling.py): ``G_l`` is the graph in which every
node keeps exactly its sampled in-edges at layer ``l`` (``sample_in_edges``; ``-1`` = all).
The model's own forward with every conv of layer ``l`` called on a DGL graph of ``G_l``
(forward pre-hooks replace the graph argument) gives the reference rows; ``GraphConv``
normalizes by ``G_l``'s source out-degrees and destination in-degrees.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from support import assert_exact, random_edge_index  # noqa: E402
from support.dgl_models import FAMILIES, build, dgl_graph  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.worker.graph.planner import sample_in_edges  # noqa: E402

pytestmark = pytest.mark.dgl
D_IN = 6


# --------------------------------------------------------------------------- oracle
def sampled_graph(store: GraphStore, fanout: int, layer: int, seed: int):
    """A DGL graph of ``G_l`` in external node IDs (in-edges of each node in CSC order)."""
    topo = store.topology
    nodes = np.arange(store.num_nodes)
    local, pos = sample_in_edges(topo.indptr, nodes, fanout, layer, seed)
    src = torch.from_numpy(topo.indices[pos].astype(np.int64))
    dst = torch.from_numpy(np.repeat(nodes, np.diff(local)))
    edge_index = torch.stack([store.to_external(src), store.to_external(dst)])
    return dgl_graph(edge_index, store.num_nodes)


def conv_layers(ev: LayerwiseEvaluator) -> dict[str, list[int]]:
    """Qualified conv name -> the layers it runs at, in call order."""
    layers: dict[str, list[int]] = {}
    for block in ev.split.blocks:
        for name in block.convs:
            layers.setdefault(name, []).append(block.index)
    return layers


@contextmanager
def convs_on(model: nn.Module, layers: dict[str, list[int]], graph_of: dict) -> Iterator[None]:
    """Forward pre-hooks: a conv's call at layer ``l`` gets ``graph_of[l]`` as its graph.

    A conv module shared across layers is called once per layer in order; calls are counted.
    """
    modules = dict(model.named_modules())
    handles = []
    for name, at in layers.items():
        calls = [0]

        def hook(module, args, at=at, calls=calls):
            layer = at[calls[0] % len(at)]
            calls[0] += 1
            return (graph_of[layer], *args[1:])

        handles.append(modules[name].register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def oracle(model, ev, store, x, fanouts: Sequence[int], seed: int) -> torch.Tensor:
    """All rows of the model's forward with layer ``l``'s convs on ``G_l`` (external order)."""
    graphs = {layer: sampled_graph(store, f, layer, seed) for layer, f in enumerate(fanouts, 1)}
    empty = dgl_graph(torch.empty(2, 0, dtype=torch.long), store.num_nodes)  # never used
    with torch.no_grad(), convs_on(model, conv_layers(ev), graphs):
        return model(empty, x)


def check(model, store, x, fanouts, seed, targets, what, ev=None) -> LayerwiseEvaluator:
    """Full and partial sampled evaluation equal the oracle; returns the evaluator."""
    ev = ev or LayerwiseEvaluator(
        model, store, init_batch_nodes=3, self_check=False, progress=False
    )
    fanouts = list(fanouts)[: ev.num_layers]
    want = oracle(model, ev, store, x, fanouts, seed)
    got = ev.evaluate(fanouts=fanouts, seed=seed)
    assert_exact(got, want, f"{what} full fanouts={fanouts} seed={seed}")
    if store.num_nodes > 1000:
        assert ev.last_stats.batches > 2 * ev.num_layers  # really batched
    got = ev.evaluate(targets=targets, fanouts=fanouts, seed=seed)
    assert_exact(got, want[targets], f"{what} partial fanouts={fanouts} seed={seed}")
    return ev


def test_oracle_hooks_every_conv():
    """The oracle's reference differs from the full-graph forward (its hooks take effect)."""
    edge_index = random_edge_index(200, 2000, seed=3)
    x = torch.randn(200, D_IN, generator=torch.Generator().manual_seed(1))
    store = GraphStore.from_edge_index(edge_index, x)
    for family in ("gcn_both", "misc"):
        model = build(family, D_IN)
        ev = LayerwiseEvaluator(model, store, progress=False)
        with torch.no_grad():
            full = model(dgl_graph(edge_index, 200), x)
        assert_exact(oracle(model, ev, store, x, [-1] * ev.num_layers, 0), full, family)
        assert (oracle(model, ev, store, x, [2] * ev.num_layers, 0) - full).abs().max() > 1e-3


# --------------------------------------------------------------------------- random graphs
@st.composite
def sampled_cases(draw):
    """Random graphs (isolated nodes, self-loops, duplicates, sometimes a hub), fanouts, seed."""
    n = draw(st.integers(1, 40))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=120))
    if draw(st.booleans()):  # node 0 becomes a hub: every node points at it (0 → 0 included)
        edges += [(u, 0) for u in range(n)]
    edge_index = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).t().contiguous()
    seed = draw(st.integers(0, 2**16))
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed))
    targets = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8))
    reorder = draw(st.sampled_from(["rcmk", None]))
    fanouts = draw(st.lists(st.sampled_from([-1, 1, 2, 3, 5]), min_size=5, max_size=5))
    sample_seed = draw(st.sampled_from([0, 1, 7, 2**64 - 1]))
    return edge_index, x, torch.tensor(targets), reorder, fanouts, sample_seed


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=sampled_cases())
def test_random_graphs_sampled_equals_oracle(family, case):
    edge_index, x, targets, reorder, fanouts, seed = case
    model = build(family, D_IN)
    store = GraphStore.from_edge_index(edge_index, x, reorder=reorder)
    check(model, store, x, fanouts, seed, targets, family)


# --------------------------------------------------------------------------- medium graph
@pytest.fixture(scope="module")
def medium_graph():
    n = 3000
    edge_index = random_edge_index(n, 24_000, seed=1)
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(2))
    return edge_index, x, GraphStore.from_edge_index(edge_index, x)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_medium_graph_sampled_many_batches(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    targets = torch.tensor([2999, 0, 17, 17, 1500, 42])
    settings_ = (([4] * 5, 0), ([-1, 3, 2, 5, 1], 5), ([2, -1, 1, -1, 3], 2**63 + 11))
    for fanouts, seed in settings_:
        ev = LayerwiseEvaluator(model, store, init_batch_nodes=61, progress=False)
        check(model, store, x, fanouts, seed, targets, family, ev=ev)


@pytest.mark.parametrize("norm", ["both", "left", "right", "none"])
def test_graphconv_hub_with_small_fanout(norm):
    """A degree-168 hub and a node with 168 out-edges, sampled to fanout 5."""
    n = 400
    others = torch.arange(1, n)
    ring = torch.stack([others, others % (n - 1) + 1])
    spokes = torch.stack([torch.arange(1, 169), torch.zeros(168, dtype=torch.long)])
    fan_out = torch.stack([torch.full((168,), 7), torch.arange(200, 368)])
    edge_index = torch.cat([ring, spokes, fan_out], 1)
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(0)).abs() + 0.5
    store = GraphStore.from_edge_index(edge_index, x)
    model = build(f"gcn_{norm}", D_IN, seed=2)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=16, progress=False)
    targets = torch.tensor([0, 7, 1, 250])
    want = oracle(model, ev, store, x, [5, 5, 5], seed=3)[targets]
    got = ev.evaluate(targets=targets, fanouts=[5, 5, 5], seed=3)
    assert_exact(got, want, f"GraphConv norm={norm} hub, fanout 5")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fanout_at_least_max_degree_is_exact(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=4)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    max_deg = int(store.in_degrees.max())
    targets = torch.tensor([5, 2999, 1234, 5])
    want = ev.evaluate(targets=targets)
    for fanouts in ([max_deg] * 5, [-1] * 5, [max_deg + 3, -1, max_deg, -1, -1]):
        fanouts = fanouts[: ev.num_layers]
        got = ev.evaluate(targets=targets, fanouts=fanouts, seed=9)
        assert_exact(got, want, f"{family} fanouts={fanouts}")


def test_sampled_out_degree_cache_evicts_and_recomputes(medium_graph, monkeypatch):
    """Alternating seeds through a one-entry cache: every evaluation still equals the oracle."""
    from hopserve.worker.convs import dgl_graphconv

    monkeypatch.setattr(dgl_graphconv, "SAMPLED_CACHE_SIZE", 1)
    edge_index, x, store = medium_graph
    model = build("gcn_both", D_IN, seed=6)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=200, progress=False)
    targets = torch.tensor([3, 2999, 100, 2500])
    for seed in (1, 2, 1, 2):
        want = oracle(model, ev, store, x, [3, 3, 3], seed)[targets]
        got = ev.evaluate(targets=targets, fanouts=[3, 3, 3], seed=seed)
        assert_exact(got, want, f"seed {seed}")
    assert all(len(a._sampled_norm) <= 1 for a in ev.split.adapters.values())
