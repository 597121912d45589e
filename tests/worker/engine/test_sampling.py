"""Sampling evaluation equals the model's own forward on the sampled computation graph.

The oracle (``support.sampling``, shared with the DGL suite): for layer ``l`` with fanout
``f_l``, ``G_l`` is the graph in which *every* node keeps exactly its sampled in-edges at
layer ``l``; the model's own forward, with every conv of layer ``l`` run on ``G_l`` (forward
pre-hooks replace its ``edge_index``), gives the reference rows. Degree statistics are
those of ``G_l``: a GCN source's normalization counts its own sampled in-edges, even when
it is not a destination of the request.
"""

from __future__ import annotations

import copy

import pytest
import torch
from support import assert_exact
from support.exactness import D_IN, PYG, family_cases
from support.models import FAMILIES, OneConv, TwoGCN, build
from support.sampling import (
    check,
    check_alternating_seeds,
    check_fanout_at_least_max_degree,
    check_medium_graph,
    check_sampled_case,
    oracle,
    sampled_cases,
)
from torch_geometric.nn import GCNConv

from hopserve import GraphStore, LayerwiseEvaluator


# --------------------------------------------------------------------------- random graphs
@family_cases(FAMILIES, 12, sampled_cases(layers=3))
def test_random_graphs_sampled_equals_oracle(family, case):
    check_sampled_case(PYG, build(family, D_IN), case, family)


# --------------------------------------------------------------------------- medium graph
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_medium_graph_sampled_many_batches(family, medium_graph):
    runs = (([4, 4, 4], 0), ([-1, 3, 2], 5), ([2, -1, 1], 2**63 + 11))
    check_medium_graph(PYG, build(family, D_IN, seed=3), medium_graph, runs, family)


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


NO_BIAS = {"bias": False}


@pytest.mark.parametrize(
    "make",
    [
        lambda d_in: OneConv(GCNConv(d_in, 4, bias=False)),
        lambda d_in: TwoGCN(d_in, 8, 4, first=NO_BIAS, second=NO_BIAS),
    ],
    ids=["OneGCN", "TwoGCN"],
)
def test_gcn_hub_with_small_fanout_keeps_its_size(make):
    """A degree-168 hub sampled to 5 in-edges is normalized by its sampled degree (6, loop
    included), not its whole-graph one (169): its embedding is not shrunk ~30-fold."""
    edge_index, x = hub_graph()
    store = GraphStore.from_edge_index(edge_index, x)
    assert int(store.in_degrees[store.to_storage(torch.tensor([0]))]) == 168
    torch.manual_seed(0)
    model = make(D_IN).eval()
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
    def fanout_lists(max_deg: int, layers: int) -> tuple[list[int], ...]:
        return [max_deg] * layers, [-1] * layers, [max_deg + 3, -1, -1]

    model = build(family, D_IN, seed=4)
    check_fanout_at_least_max_degree(model, medium_graph, fanout_lists, family)


def test_sampled_statistics_cache_evicts_and_recomputes(medium_graph, monkeypatch):
    """Alternating seeds through a one-entry cache: every evaluation still equals the oracle."""
    from hopserve.worker.convs import gcn

    monkeypatch.setattr(gcn, "SAMPLED_CACHE_SIZE", 1)
    ev = check_alternating_seeds(PYG, build("gcn", D_IN, seed=6), medium_graph, [3, 3], "{seed}")
    assert all(len(a._sampled_loops) <= 1 for a in ev.split.adapters.values())


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("family", ["gcn", "gcn_noloops", "sage_mean", "gat"])
def test_cuda_sampled_equals_oracle(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    # The evaluator moves the model it gets to its device; the oracle runs a CPU copy.
    on_gpu = copy.deepcopy(model)
    ev = LayerwiseEvaluator(on_gpu, store, device="cuda", init_batch_nodes=97, progress=False)
    targets = torch.tensor([2999, 0, 17, 1500])
    check(model, store, x, [4, 2, 3], 1, targets, f"{family} on cuda", ev=ev)
