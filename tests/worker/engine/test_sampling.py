"""Sampling evaluation equals the model's own forward on the sampled computation graph.

The oracle: for layer ``l`` with fanout ``f_l``, ``G_l`` is the graph in which *every* node
keeps exactly its sampled in-edges at layer ``l`` (``sample_in_edges``: the ``<= f_l``
in-edges with the smallest hash of ``(seed, l, CSC position)``; ``-1`` = all). The model's
own forward, with every conv of layer ``l`` run on ``G_l`` (forward pre-hooks replace its
``edge_index``), gives the reference rows. Degree statistics are those of ``G_l``: a
GCN source's normalization counts its own sampled in-edges, even when it is not a
destination of the request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import assert_exact, random_edge_index
from support.models import FAMILIES, build
from torch import nn
from torch_geometric.nn import GCNConv

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.convs.base import fresh_conv_caches
from hopserve.worker.graph.planner import sample_in_edges

D_IN = 6


# --------------------------------------------------------------------------- oracle
def sampled_edge_index(store: GraphStore, fanout: int, layer: int, seed: int) -> torch.Tensor:
    """``G_l`` as a ``[2, E_l]`` edge index in external node IDs (row 0 = source)."""
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
    """Forward pre-hooks: a conv's call at layer ``l`` gets ``graph_of[l]`` as argument ``arg``.

    A conv module shared across layers is called once per layer in order; calls are counted.
    """
    modules = dict(model.named_modules())
    handles = []
    for name, at in layers.items():
        calls = [0]

        def hook(module, args, at=at, calls=calls):
            layer = at[calls[0] % len(at)]
            calls[0] += 1
            args = list(args)
            args[arg] = graph_of[layer]
            return tuple(args)

        handles.append(modules[name].register_forward_pre_hook(hook))
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
) -> torch.Tensor:
    """All rows of the model's forward with layer ``l``'s convs on ``G_l`` (external order)."""
    graphs = {
        layer: sampled_edge_index(store, f, layer, seed) for layer, f in enumerate(fanouts, 1)
    }
    full = torch.empty(2, 0, dtype=torch.long)  # no conv may see the unsampled graph
    with torch.no_grad(), fresh_conv_caches(model), convs_on(model, conv_layers(ev), graphs, 1):
        return model(x, full)


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
    fanouts = draw(st.lists(st.sampled_from([-1, 1, 2, 3, 5]), min_size=3, max_size=3))
    sample_seed = draw(st.sampled_from([0, 1, 7, 2**64 - 1]))
    return edge_index, x, torch.tensor(targets), reorder, fanouts, sample_seed


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(
    max_examples=12,
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
    for fanouts, seed in (([4, 4, 4], 0), ([-1, 3, 2], 5), ([2, -1, 1], 2**63 + 11)):
        ev = LayerwiseEvaluator(model, store, init_batch_nodes=61, progress=False)
        check(model, store, x, fanouts, seed, targets, family, ev=ev)


# --------------------------------------------------------------------------- regression
def hub_graph(n: int = 400, hub_degree: int = 168) -> tuple[torch.Tensor, torch.Tensor]:
    """Node 0 has ``hub_degree`` in-edges; every other node has a few (a ring and chords)."""
    others = torch.arange(1, n)
    ring = torch.stack([others, others % (n - 1) + 1])
    chords = torch.stack([others, (others * 7) % (n - 1) + 1])
    spokes = torch.stack(
        [torch.arange(1, hub_degree + 1), torch.zeros(hub_degree, dtype=torch.long)]
    )
    back = torch.stack([torch.zeros(20, dtype=torch.long), torch.arange(1, 21)])
    edge_index = torch.cat([ring, chords, spokes, back], 1)
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(0)).abs() + 0.5
    return edge_index, x


class OneGCN(nn.Module):
    def __init__(self, d_in: int, d_out: int = 4):
        super().__init__()
        self.conv = GCNConv(d_in, d_out, bias=False)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


class TwoGCN(nn.Module):
    def __init__(self, d_in: int, hidden: int = 8, d_out: int = 4):
        super().__init__()
        self.conv1 = GCNConv(d_in, hidden, bias=False)
        self.conv2 = GCNConv(hidden, d_out, bias=False)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


@pytest.mark.parametrize("model_cls", [OneGCN, TwoGCN])
def test_gcn_hub_with_small_fanout_keeps_its_size(model_cls):
    """A degree-168 hub sampled to 5 in-edges is normalized by its sampled degree (6, loop
    included), not its whole-graph one (169): its embedding is not shrunk ~30-fold."""
    edge_index, x = hub_graph()
    store = GraphStore.from_edge_index(edge_index, x)
    assert int(store.in_degrees[store.to_storage(torch.tensor([0]))]) == 168
    torch.manual_seed(0)
    model = model_cls(D_IN).eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=16, progress=False)
    fanouts = [5] * ev.num_layers
    hub = torch.tensor([0])
    want = oracle(model, ev, store, x, fanouts, seed=3)[hub]
    got = ev.evaluate(targets=hub, fanouts=fanouts, seed=3)
    ratio = (got.norm() / want.norm()).item()
    assert 0.9 < ratio < 1.1, f"sampled hub embedding is {ratio:.3f}x the oracle's"
    assert_exact(got, want, "gcn hub, fanout 5")
    # Neighbours of the hub, batched with and without it: the same rows.
    some = torch.tensor([0, 1, 2, 167, 168, 399])
    assert_exact(
        ev.evaluate(targets=some, fanouts=fanouts, seed=3),
        oracle(model, ev, store, x, fanouts, seed=3)[some],
        "gcn hub neighbourhood",
    )


# --------------------------------------------------------------------------- exact limits
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fanout_at_least_max_degree_is_exact(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=4)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    max_deg = int(store.in_degrees.max())
    targets = torch.tensor([5, 2999, 1234, 5])
    want = ev.evaluate(targets=targets)
    for fanouts in ([max_deg] * ev.num_layers, [-1] * ev.num_layers, [max_deg + 3, -1, -1]):
        fanouts = fanouts[: ev.num_layers]
        got = ev.evaluate(targets=targets, fanouts=fanouts, seed=9)
        assert_exact(got, want, f"{family} fanouts={fanouts}")


def test_sampled_statistics_cache_evicts_and_recomputes(medium_graph, monkeypatch):
    """Alternating seeds through a one-entry cache: every evaluation still equals the oracle."""
    from hopserve.worker.convs import gcn

    monkeypatch.setattr(gcn, "SAMPLED_CACHE_SIZE", 1)
    edge_index, x, store = medium_graph
    model = build("gcn", D_IN, seed=6)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=200, progress=False)
    targets = torch.tensor([3, 2999, 100, 2500])
    for seed in (1, 2, 1, 2):
        want = oracle(model, ev, store, x, [3, 3], seed)[targets]
        assert_exact(ev.evaluate(targets=targets, fanouts=[3, 3], seed=seed), want, f"{seed}")
    assert all(len(a._sampled_loops) <= 1 for a in ev.split.adapters.values())


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("family", ["gcn", "gcn_noloops", "sage_mean", "gat"])
def test_cuda_sampled_equals_oracle(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    ev = LayerwiseEvaluator(model, store, device="cuda", init_batch_nodes=97, progress=False)
    targets = torch.tensor([2999, 0, 17, 1500])
    check(model, store, x, [4, 2, 3], 1, targets, f"{family} on cuda", ev=ev)
