"""Full layers: the source-side work of GraphConv / SAGEConv is done once per layer, exactly.

On a full evaluation every batch of a layer reads the same stored table; the adapters
derive DGL's source side from it once per layer (``LayerTableCache``), as DGL's full-graph
forward does: GraphConv ``c_out ⊙ x``, or ``(c_out ⊙ x) W`` when ``in > out``; SAGEConv
``fc_neigh(x)`` when ``in > out``; and drop it after the layer's last batch.
"""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from support import assert_exact  # noqa: E402
from support.dgl_models import DGL, build  # noqa: E402
from support.exactness import D_IN  # noqa: E402

from hopserve import LayerwiseEvaluator  # noqa: E402
from hopserve.worker.convs.dgl_conv import LayerTableCache  # noqa: E402

pytestmark = pytest.mark.dgl


@pytest.fixture
def per_edge_factor_sums(monkeypatch):
    """Counts GraphConv's aggregations with a per-edge factor (torch CSR SpMM)."""
    from hopserve.worker.convs import dgl_graphconv

    calls: list[int] = []
    real = dgl_graphconv.csr_weighted_sum

    def spy(indptr, indices, values, dense, size):
        calls.append(int(values.numel()))
        return real(indptr, indices, values, dense, size)

    monkeypatch.setattr(dgl_graphconv, "csr_weighted_sum", spy)
    return calls


@pytest.fixture
def table_builds(monkeypatch):
    """Counts the derived tables built (cache misses, and tables derived up front before
    the layer's input is freed) during a test."""
    builds: list[tuple[int, ...]] = []
    real_get, real_put = LayerTableCache.get, LayerTableCache.put

    def spy(self, x, key, batch, make):
        def counted():
            t = make()
            builds.append(tuple(t.shape))
            return t

        return real_get(self, x, key, batch, counted)

    def spy_put(self, x, key, value):
        builds.append(tuple(value.shape))
        real_put(self, x, key, value)

    monkeypatch.setattr(LayerTableCache, "get", spy)
    monkeypatch.setattr(LayerTableCache, "put", spy_put)
    return builds


@pytest.mark.parametrize("family", ["gcn_both", "gcn_left", "sage_mean", "sage_gcn"])
def test_full_layer_table_once_per_layer_and_exact(
    family, medium_graph, table_builds, per_edge_factor_sums
):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=2)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=100, progress=False)
    table_builds.clear()  # the evaluator's load-time self-check runs a small graph
    per_edge_factor_sums.clear()
    assert_exact(ev.evaluate(), DGL.forward(model, edge_index, x), f"{family} full")
    stats = ev.last_stats
    many = [ly.layer for ly in stats.layers if ly.gather_free and ly.batches > 1]
    assert many, "expected gather-free layers of several batches"
    n = store.num_nodes
    freed = [ly.freed_inputs for ly in stats.layers if ly.layer > 0]
    if family.startswith("gcn"):
        # GraphConv: one table a layer, DGL's own source side: c_out ⊙ x (D_IN -> 16,
        # 16 -> 16), then (c_out ⊙ x) W (16 -> 5); each is all its layer reads, so each
        # layer's input is freed once its table is built.
        assert table_builds == [(n, D_IN), (n, 16), (n, 5)], (table_builds, many)
        assert freed == [1, 1, 1], freed
        assert per_edge_factor_sums == [], "every batch aggregates its table (copy_u)"
    else:
        # SAGEConv: only the in > out layer builds fc_neigh(x) (16 -> 5); it reads x's
        # destination rows too (fc_self), so nothing is freed.
        assert table_builds == [(n, 5)], (table_builds, many)
        assert freed == [0, 0, 0], freed


def test_graphconv_tables_never_sit_beside_a_kept_input(
    medium_graph, table_builds, per_edge_factor_sums
):
    """JKNet keeps every layer for its head: GraphConv makes its ``c_out ⊙ x`` table only
    beside the graph's features (layer 1, derived up front, nothing freed) and reads the
    kept layers 2 and 3 in place with per-edge factors: no third layer-sized tensor."""
    edge_index, x, store = medium_graph
    model = build("jk_cat", D_IN, seed=7)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=100, progress=False)
    table_builds.clear()
    per_edge_factor_sums.clear()
    assert_exact(ev.evaluate(), DGL.forward(model, edge_index, x), "jk_cat full")
    layers = [ly for ly in ev.last_stats.layers if ly.layer > 0]
    assert all(ly.gather_free and ly.batches > 1 for ly in layers), layers
    assert table_builds == [(store.num_nodes, D_IN)], table_builds
    assert [ly.freed_inputs for ly in layers] == [0, 0, 0]
    # layers 2 and 3: every edge once, with its factor
    assert sum(per_edge_factor_sums) == 2 * store.num_edges, per_edge_factor_sums


@pytest.mark.parametrize(("family", "freed"), [("gat", [0, 0]), ("gat_plain", [0, 1])])
def test_gat_full_layers_read_a_once_per_layer_source_table(
    family, freed, medium_graph, monkeypatch
):
    """GATConv (multi-head, with residuals or not): W x and the source logits once per full
    layer, each batch reading them in place; without a residual the second layer's input
    is freed once its table is derived; partial frontiers gather and still agree."""
    from hopserve.worker.convs.dgl_gat import DGLGATAdapter

    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=5)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=100, progress=False)
    sources: list[int] = []
    real = DGLGATAdapter._make_table

    def spy(self, x):
        sources.append(int(x.shape[1]))
        return real(self, x)

    monkeypatch.setattr(DGLGATAdapter, "_make_table", spy)
    assert_exact(ev.evaluate(), want, f"{family} full")
    layers = [ly for ly in ev.last_stats.layers if ly.layer > 0]
    assert all(ly.gather_free and ly.batches > 1 for ly in layers), layers
    assert sources == [D_IN, 24]  # one source table per layer, not per batch
    assert [ly.freed_inputs for ly in layers] == freed
    assert all(a._source._entry is None for a in ev.split.adapters.values())  # dropped
    targets = torch.tensor([2999, 0, 17, 1500])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family} partial")
    assert not any(ly.gather_free for ly in ev.last_stats.layers)


@pytest.mark.parametrize("family", ["gcn_both", "sage_mean"])
def test_layer_tables_are_dropped_and_follow_weight_updates(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=100, progress=False)
    ev.evaluate()
    caches = [a._tables for a in ev.split.adapters.values() if hasattr(a, "_tables")]
    assert caches and all(c._entry is None for c in caches)  # nothing kept after the run
    with torch.no_grad():  # an in-place weight update (load_state_dict does the same)
        for p in model.parameters():
            p.mul_(0.5)
    assert_exact(ev.evaluate(), DGL.forward(model, edge_index, x), f"{family} updated")


def test_partial_and_full_agree_on_graphconv(medium_graph):
    """Partial evaluation (gathered sources, per-edge weights) and full layers agree."""
    edge_index, x, store = medium_graph
    model = build("gcn_both", D_IN, seed=4)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=100, progress=False)
    ids = torch.tensor([2999, 0, 17, 1500, 42])
    assert_exact(ev.evaluate(targets=ids), want[ids], "gcn partial")
    assert_exact(ev.evaluate(), want, "gcn full")


@pytest.mark.parametrize(
    "family", ["gcn_both", "gcn_left", "gcn_right", "sage_mean", "sage_pool", "gat", "jk_cat"]
)
def test_one_batch_full_layers_are_exact(family, medium_graph):
    """Each layer one batch (a budget the whole graph fits in): the layers share one block
    (the whole graph's, built once per run), keep their conv outputs, and equal DGL's own
    full-graph forward, run after run."""
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=6)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(
        model, store, memory_budget_bytes=1 << 30, init_batch_nodes=1 << 20, progress=False
    )
    for run in range(2):
        assert_exact(ev.evaluate(), want, f"{family} one batch a layer, run {run}")
        layers = [ly for ly in ev.last_stats.layers if ly.layer > 0]
        assert all(ly.batches == 1 for ly in layers), [ly.batches for ly in layers]
    ids = torch.tensor([2999, 0, 17, 1500, 42])
    assert_exact(ev.evaluate(targets=ids), want[ids], f"{family} partial")
