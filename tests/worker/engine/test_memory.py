"""Batch-size control, OOM halving, storage tiers and out-of-core graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_exact, random_edge_index
from support.models import build

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.engine.batching import BatchSizer


@pytest.fixture(scope="module")
def graph():
    n = 1200
    edge_index = random_edge_index(n, 9000, seed=5)
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(6))
    return edge_index, x


def test_tiny_budget_forces_halving_and_stays_exact(graph):
    edge_index, x = graph
    model = build("sage_mean", 6)
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(model, store, memory_budget_bytes=60_000, progress=False)
    got = ev.evaluate()
    with torch.no_grad():
        assert_exact(got, model(x, edge_index), "halving")
    assert ev.last_stats.oom_halvings > 0
    # The pre-compute check keeps inputs + messages under budget; outputs come on top.
    assert max(layer.peak_bytes for layer in ev.last_stats.layers) <= 2 * 60_000


def test_thresholds_follow_dgi_eq2():
    sizer = BatchSizer(target_bytes=1000, max_nodes=100, max_edges=1000)
    sizer.observe(500)  # r = 2
    assert (sizer.max_nodes, sizer.max_edges) == (200, 2000)
    sizer.observe(4000)  # r = 1/4
    assert (sizer.max_nodes, sizer.max_edges) == (50, 500)
    sizer.halve()
    assert (sizer.max_nodes, sizer.max_edges) == (25, 250)


def test_a_cpu_batch_over_its_budget_is_redone_at_the_target():
    """A CPU batch knows its account before it runs: the redo is scaled by target over
    predicted (not halved), at most 0.9 so it always shrinks, at least 1/4."""
    sizer = BatchSizer(target_bytes=800, max_nodes=100, max_edges=1000)
    sizer.fit(1000, 100, 1000)  # r = 0.8
    assert (sizer.max_nodes, sizer.max_edges) == pytest.approx((80, 800))
    sizer.fit(820, 80, 800)  # r = 800 / 820 > 0.9: capped
    assert (sizer.max_nodes, sizer.max_edges) == pytest.approx((72, 720))
    sizer.fit(10**6, 72, 720)  # r = 1/4 at least
    assert (sizer.max_nodes, sizer.max_edges) == pytest.approx((18, 180))
    # A batch cut short (end of its layer, or by the other threshold) is what is scaled:
    # thresholds far above it would redo the same batch several times.
    sizer = BatchSizer(target_bytes=800, max_nodes=1000, max_edges=10_000)
    sizer.fit(1000, 50, 4000)
    assert (sizer.max_nodes, sizer.max_edges) == pytest.approx((40, 3200))


def test_a_batch_cut_short_by_its_layer_never_grows_the_thresholds():
    """The last batch of a layer is as small as the rows left: its low peak must not
    grow the thresholds the next run's first batch starts from (it may still shrink
    them)."""
    sizer = BatchSizer(target_bytes=1000, max_nodes=100, max_edges=1000)
    sizer.observe(100, at_thresholds=False)  # r would be 2
    assert (sizer.max_nodes, sizer.max_edges) == (100, 1000)
    sizer.observe(2000, at_thresholds=False)  # r = 1/2
    assert (sizer.max_nodes, sizer.max_edges) == (50, 500)


def test_every_runs_batches_stay_within_the_cpu_budget(graph):
    """After the first run (whose first batches learn the outputs' size) no batch's
    accounted peak passes the budget: a layer's first batch starts from thresholds no
    short last batch inflated, and is checked against the outputs learned before."""
    edge_index, x = graph
    model = build("sage_mean", 6)
    store = GraphStore.from_edge_index(edge_index, x)
    budget = 100_000
    ev = LayerwiseEvaluator(model, store, memory_budget_bytes=budget, progress=False)
    with torch.no_grad():
        want = model(x, edge_index)
    peaks, halvings = [], []
    for _ in range(4):
        assert_exact(ev.evaluate(), want, "repeated runs")
        peaks.append(max(layer.peak_bytes for layer in ev.last_stats.layers))
        halvings.append(ev.last_stats.oom_halvings)
    assert peaks[0] <= 2 * budget and max(peaks[1:]) <= budget, peaks
    # No thresholds inflated by a short last batch: later runs redo a batch rarely, if ever
    # (a redo is sized to fit, so it lands near the budget and a denser stretch can tip one).
    assert halvings[0] > 0 and max(halvings[1:]) <= 1, halvings
    assert all(sizer.out_row_bytes > 0 for sizer in ev._sizers.values())


def test_batch_cut_by_edge_prefix_sums():
    sizer = BatchSizer(target_bytes=1, max_nodes=10, max_edges=5)
    cum = torch.tensor([0, 2, 4, 6, 8, 10])  # degree 2 each
    assert sizer.next_end(cum, 0) == 2  # 2 nodes = 4 edges; a third would make 6
    assert sizer.next_end(cum, 4) == 5
    heavy = torch.tensor([0, 100, 101])
    assert sizer.next_end(heavy, 0) == 1  # one node even if over the edge threshold


def test_disk_tier_spills_and_stays_exact(graph, tmp_path):
    edge_index, x = graph
    model = build("jk_cat", 6)
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(model, store, host_memory_budget_bytes=1, spill_dir=str(tmp_path))
    got = ev.evaluate()
    with torch.no_grad():
        assert_exact(got, model(x, edge_index), "disk tier")
    assert set(ev.last_stats.tiers.values()) == {"disk"}
    assert list(tmp_path.iterdir()) == []  # spill files removed


def test_out_of_core_features_from_memmap(graph, tmp_path):
    edge_index, x = graph
    model = build("gcn", 6)
    GraphStore.from_edge_index(edge_index, x).save(tmp_path / "g")
    store = GraphStore.open(tmp_path / "g")
    assert isinstance(np.load(tmp_path / "g" / "features.npy", mmap_mode="r"), np.memmap)
    ev = LayerwiseEvaluator(model, store, progress=False)
    with torch.no_grad():
        want = model(x, edge_index)
    assert_exact(ev.evaluate(), want, "memmap store")
    ids = torch.tensor([5, 1100, 5])
    assert_exact(ev.evaluate(targets=ids), want[ids], "memmap store partial")


def test_no_prefetch_gives_same_result(graph):
    edge_index, x = graph
    model = build("gat", 6)
    store = GraphStore.from_edge_index(edge_index, x)
    a = LayerwiseEvaluator(model, store, prefetch=False, init_batch_nodes=50).evaluate()
    b = LayerwiseEvaluator(model, store, prefetch=True, init_batch_nodes=50).evaluate()
    assert_exact(a, b, "prefetch on/off")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_oom_halving_with_a_real_out_of_memory_error():
    """With 32 MiB of device memory left, the first batch (the whole graph, ~50 MiB of
    indices and inputs) raises a real CUDA OOM; halving finds sizes that fit, rows exact."""
    n, d = 50_000, 64
    edge_index = random_edge_index(n, 2_000_000, seed=7)
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(8))
    model = build("sage_mean", d)
    with torch.no_grad():
        want = model(x, edge_index)
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(
        model, store, device="cuda", init_batch_nodes=1 << 20, graph_on_device=False,
        progress=False,
    )  # fmt: skip
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - (32 << 20), dtype=torch.uint8, device="cuda")
    try:
        got = ev.evaluate()
    finally:
        del hog
        torch.cuda.empty_cache()
    assert ev.last_stats.oom_halvings > 0
    assert_exact(got, want, "cuda oom halving")


def test_thresholds_stay_bounded_in_a_long_lived_evaluator(graph):
    edge_index, x = graph
    store = GraphStore.from_edge_index(edge_index, x)
    ev = LayerwiseEvaluator(build("sage_mean", 6), store, progress=False)
    for _ in range(80):  # each evaluation may grow the thresholds
        ev.evaluate(targets=[1, 2])
    for sizer in ev._sizers.values():
        assert sizer.max_nodes <= store.num_nodes and sizer.max_edges <= store.num_edges
