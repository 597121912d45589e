"""DGL models (``forward(g, x)``): layer-wise results equal the model's own full-graph forward.

The harness is ``support.exactness``, shared with tests/worker/engine/test_exactness.py.
"""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from support import assert_exact, random_edge_index  # noqa: E402
from support.dgl_models import DGL, FAMILIES, GCN, GraphSAGE, build, dgl_graph  # noqa: E402
from support.exactness import (  # noqa: E402
    D_IN,
    assert_full_and_partial,
    check_medium_graph,
    check_random_graph,
    family_cases,
    graphs,
)

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402

pytestmark = pytest.mark.dgl


@family_cases(FAMILIES, 25, graphs())
def test_random_graphs_full_and_partial(family, case):
    check_random_graph(DGL, build(family, D_IN), case, family)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_medium_graph_many_batches(family, medium_graph):
    ev = check_medium_graph(DGL, build(family, D_IN, seed=3), medium_graph, family)
    assert ev.split.style == "dgl"


@pytest.mark.parametrize("norm", ["both", "left"])
def test_graphconv_uses_whole_graph_out_degrees(norm, medium_graph):
    """Run on a block with DGL's own (block) out-degrees, GraphConv would differ."""
    edge_index, x, store = medium_graph
    model = build(f"gcn_{norm}", D_IN, seed=5)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=50, progress=False)
    assert_exact(ev.evaluate(), want, f"gcn {norm}")
    # The naive block run (the conv's own norm on block out-degrees) is measurably off.
    conv = model.conv1
    first = torch.arange(50)
    sub = dgl.in_subgraph(dgl_graph(edge_index, x.shape[0]), first)
    block = dgl.to_block(sub, first)
    with torch.no_grad():
        naive = conv(block, x[block.srcdata[dgl.NID]])
        full = conv(dgl_graph(edge_index, x.shape[0]), x)[first]
    assert (naive - full).abs().max() > 1e-3


def test_zero_in_degree_refused_like_dgl_and_self_loops_fix_it(medium_graph):
    """allow_zero_in_degree=False: refused where DGL's forward raises, exact where it runs."""
    edge_index, x, _ = medium_graph  # node 2999 has no in-edge
    model = GCN(D_IN, zero_ok=False).eval()
    with pytest.raises(dgl.DGLError):
        model(dgl_graph(edge_index, x.shape[0]), x)
    store = GraphStore.from_edge_index(edge_index, x)
    with pytest.raises(ValueError, match=r"allow_zero_in_degree=False.*self-loops"):
        LayerwiseEvaluator(model, store, progress=False)
    looped = GraphStore.from_edge_index(edge_index, x, add_self_loops=True)
    lacking = torch.ones(x.shape[0], dtype=torch.bool)
    lacking[edge_index[0][edge_index[0] == edge_index[1]]] = False
    loops = lacking.nonzero().squeeze(1).repeat(2, 1)  # what add_self_loops adds
    want = DGL.forward(model, torch.cat([edge_index, loops], 1), x)
    ev = LayerwiseEvaluator(model, looped, init_batch_nodes=200, progress=False)
    assert_exact(ev.evaluate(), want, "gcn with self-loops, zero in-degree disallowed")


def test_sage_lstm_in_edge_id_order():
    """LSTM reads neighbours in edge-id order: exact when those are ascending source ids."""
    n = 400
    edge_index = random_edge_index(n, 2400, seed=4)
    order = torch.argsort(edge_index[1] * n + edge_index[0], stable=True)
    edge_index = edge_index[:, order]  # in-edges of each node by ascending source
    x = torch.randn(n, D_IN, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    model = GraphSAGE(D_IN, aggregator="lstm").eval()
    want = DGL.forward(model, edge_index, x)
    store = GraphStore.from_edge_index(edge_index, x, reorder=None)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=37, progress=False)
    assert_full_and_partial(ev, want, torch.tensor([3, 399, 17]), "sage lstm")


@pytest.mark.parametrize("family", ["gcn_both", "sage_mean", "gat", "jk_cat"])
def test_synthetic_powerlaw_full_and_partial(family, tmp_path):
    from hopserve.worker.graph.synth import synth_powerlaw

    store = synth_powerlaw(5000, 12.0, 8, seed=3, out=tmp_path / "g", progress=False)
    # The full-graph reference in storage numbering (node IDs map to storage rows).
    dst = torch.repeat_interleave(torch.arange(store.num_nodes), store.in_degrees)
    edge_index = torch.stack([store.indices.long(), dst])
    x = store.features.float()
    model = build(family, 8, seed=1)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, progress=False, memory_budget_bytes=1 << 20)
    storage_order = store.sorted_external_order()
    assert_exact(ev.evaluate(), want[storage_order], f"{family} full")
    ids = store.to_external(torch.tensor([0, 4999, 123, 2500]))
    got = ev.evaluate(targets=ids)
    assert_exact(got, want[store.to_storage(ids)], f"{family} partial")


@pytest.mark.parametrize("family", ["gat", "gatv2", "misc"])
def test_u_mul_e_runs_as_csr_spmm_exactly(family, medium_graph, monkeypatch):
    """Attention-weighted sums take the torch CSR SpMM path on every block here."""
    from hopserve.worker.convs import dgl_conv

    calls = []
    real = dgl_conv._u_mul_e_sum

    def spy(graph, mfunc, rfunc):
        out = real(graph, mfunc, rfunc)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(dgl_conv, "SPMM_MIN_EDGES", 0)
    monkeypatch.setattr(dgl_conv, "_u_mul_e_sum", spy)
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=4)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=150, progress=False)
    assert_exact(ev.evaluate(), want, f"{family} via CSR SpMM")
    assert any(calls)
