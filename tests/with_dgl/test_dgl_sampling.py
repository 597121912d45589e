"""DGL models: sampling evaluation equals the model's own forward on the sampled graphs.

The oracle (``support.sampling``, shared with tests/worker/engine/test_sampling.py): ``G_l``
is the graph in which every node keeps exactly its sampled in-edges at layer ``l``
(``sample_in_edges``; ``-1`` = all). The model's own forward with every conv of layer ``l``
called on a DGL graph of ``G_l`` (forward pre-hooks replace the graph argument) gives the
reference rows; ``GraphConv`` normalizes by ``G_l``'s source out-degrees and destination
in-degrees.
"""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from support import (  # noqa: E402
    assert_exact,
    random_graph,
    sampling,  # noqa: E402
)
from support.dgl_models import DGL, FAMILIES, build  # noqa: E402
from support.exactness import D_IN, family_cases  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402

pytestmark = pytest.mark.dgl


def test_oracle_hooks_every_conv():
    """The oracle's reference differs from the full-graph forward (its hooks take effect)."""
    edge_index, x, store = random_graph(200, 2000, D_IN, seed=3, x_seed=1)
    for family in ("gcn_both", "misc"):
        model = build(family, D_IN)
        ev = LayerwiseEvaluator(model, store, progress=False)
        full = DGL.forward(model, edge_index, x)
        assert_exact(
            sampling.oracle(model, ev, store, x, [-1] * ev.num_layers, 0, DGL), full, family
        )
        assert (
            sampling.oracle(model, ev, store, x, [2] * ev.num_layers, 0, DGL) - full
        ).abs().max() > 1e-3


# --------------------------------------------------------------------------- random graphs
@family_cases(FAMILIES, 10, sampling.sampled_cases(layers=5))
def test_random_graphs_sampled_equals_oracle(family, case):
    sampling.check_sampled_case(DGL, build(family, D_IN), case, family)


# --------------------------------------------------------------------------- medium graph
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_medium_graph_sampled_many_batches(family, medium_graph):
    runs = (([4] * 5, 0), ([-1, 3, 2, 5, 1], 5), ([2, -1, 1, -1, 3], 2**63 + 11))
    sampling.check_medium_graph(DGL, build(family, D_IN, seed=3), medium_graph, runs, family)


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
    want = sampling.oracle(model, ev, store, x, [5, 5, 5], seed=3, style=DGL)[targets]
    got = ev.evaluate(targets=targets, fanouts=[5, 5, 5], seed=3)
    assert_exact(got, want, f"GraphConv norm={norm} hub, fanout 5")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fanout_at_least_max_degree_is_exact(family, medium_graph):
    def fanout_lists(max_deg: int, layers: int) -> tuple[list[int], ...]:
        return [max_deg] * 5, [-1] * 5, [max_deg + 3, -1, max_deg, -1, -1]

    model = build(family, D_IN, seed=4)
    sampling.check_fanout_at_least_max_degree(model, medium_graph, fanout_lists, family)


def test_sampled_out_degree_cache_evicts_and_recomputes(medium_graph, monkeypatch):
    """Alternating seeds through a one-entry cache: every evaluation still equals the oracle."""
    from hopserve.worker.convs import dgl_graphconv

    monkeypatch.setattr(dgl_graphconv, "SAMPLED_CACHE_SIZE", 1)
    model = build("gcn_both", D_IN, seed=6)
    ev = sampling.check_alternating_seeds(DGL, model, medium_graph, [3, 3, 3], "seed {seed}")
    assert all(len(a._sampled_norm) <= 1 for a in ev.split.adapters.values())
