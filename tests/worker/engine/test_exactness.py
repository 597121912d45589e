"""Layer-wise results equal the model's own full-graph forward, per model family.

The harness (random graphs, the medium graph, the checks) is ``support.exactness``, shared
with the DGL suite (tests/with_dgl/test_dgl_exactness.py).
"""

from __future__ import annotations

import pytest
import torch
from support.exactness import (
    D_IN,
    PYG,
    assert_full_and_partial,
    check_medium_graph,
    check_random_graph,
    family_cases,
    graphs,
)
from support.models import FAMILIES, build

from hopserve import LayerwiseEvaluator


@family_cases(FAMILIES, 12, graphs())
def test_random_graphs_full_and_partial(family, case):
    check_random_graph(PYG, build(family, D_IN), case, family)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_medium_graph_many_batches(family, medium_graph):
    check_medium_graph(PYG, build(family, D_IN, seed=3), medium_graph, family)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("resident", [True, False], ids=["graph-on-device", "graph-on-host"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cuda_matches_forward(family, resident, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    want = PYG.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(
        model,
        store,
        device="cuda",
        init_batch_nodes=97,
        graph_on_device=resident,
        progress=False,
    )
    assert ev.graph_resident is resident
    targets = torch.tensor([2999, 0, 17, 1500])
    assert_full_and_partial(ev, want, targets, family, " on cuda")
