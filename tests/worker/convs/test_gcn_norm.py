"""GCN-normalized convs other than ``GCNConv`` (``LGConv``, ``DNAConv``, ``EGConv``) and
``AntiSymmetricConv`` (its inner ``GCNConv``): exact in many batches, and sampled evaluation
equals the model's forward on the sampled graph (degrees of ``G_l``, not the whole graph's).
"""

from __future__ import annotations

import pytest
import torch
from support import conv_audit as audit
from support.exactness import PYG, check_medium_graph
from support.sampling import check
from support.sampling import check_medium_graph as check_medium_sampled

from hopserve import GraphStore, LayerwiseEvaluator

CASES = {
    "LGConv": 0,
    "DNAConv": 0,
    "EGConv": 0,
    "EGConv-no-symnorm": ("EGConv", 1),
    "AntiSymmetricConv": 0,
}


def model_of(key: str, seed: int = 3) -> torch.nn.Module:
    name, index = CASES[key] if isinstance(CASES[key], tuple) else (key, CASES[key])
    return audit.build_model("pyg", audit.pyg_classes()[name], audit.PYG_CASES[name][index], seed)


@pytest.mark.parametrize("key", sorted(CASES))
def test_medium_graph_many_batches(key, medium_graph):
    check_medium_graph(PYG, model_of(key), medium_graph, key)


@pytest.mark.parametrize("key", sorted(CASES))
def test_medium_graph_sampled(key, medium_graph):
    check_medium_sampled(PYG, model_of(key), medium_graph, [([3, 2], 7), ([-1, 1], 0)], key)


@pytest.mark.parametrize("key", ["LGConv", "DNAConv", "EGConv"])
def test_hub_sampled_keeps_its_sampled_degree(key):
    """A hub with 150 in-edges sampled to 4: its normalization uses 4 (G_l), not 150."""
    n = 300
    others = torch.arange(1, n)
    ring = torch.stack([others, others % (n - 1) + 1])
    spokes = torch.stack([torch.arange(1, 151), torch.zeros(150, dtype=torch.long)])
    back = torch.stack([torch.zeros(30, dtype=torch.long), torch.arange(1, 31)])
    edge_index = torch.cat([ring, spokes, back], 1)
    x = torch.randn(n, audit.D_IN, generator=torch.Generator().manual_seed(0))
    store = GraphStore.from_edge_index(edge_index, x)
    model = model_of(key)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=16, progress=False)
    check(model, store, x, [4, 4], 5, torch.tensor([1, 0, 2, 29]), key, ev=ev)
