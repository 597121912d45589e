"""The public API contract: ordering, IDs, errors, stats."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_edge_index
from support.models import build

from hopserve import GraphStore, LayerwiseEvaluator


@pytest.fixture(scope="module")
def setup():
    n = 400
    edge_index = random_edge_index(n, 2500, seed=10)
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(11))
    model = build("sage_mean", 6)
    store = GraphStore.from_edge_index(edge_index, x)  # RCMK inside, caller numbering outside
    with torch.no_grad():
        want = model(x, edge_index)
    return store, LayerwiseEvaluator(model, store, init_batch_nodes=40), want


def test_row_i_is_node_i_despite_internal_reordering(setup):
    store, ev, want = setup
    assert store.ordering == "rcmk"
    assert_exact(ev.evaluate(), want, "full")


def test_partial_rows_follow_request_order_with_duplicates(setup):
    _, ev, want = setup
    ids = [399, 3, 3, 250, 0]
    assert_exact(ev.evaluate(targets=ids), want[ids], "partial order")


def test_unknown_ids_are_named(setup):
    _, ev, _ = setup
    with pytest.raises(KeyError) as info:
        ev.evaluate(targets=[1, 400, 10_000])
    assert "400" in str(info.value) and "10000" in str(info.value)


def test_bad_targets_and_fanouts(setup):
    _, ev, _ = setup
    with pytest.raises(ValueError, match="empty"):
        ev.evaluate(targets=[])
    with pytest.raises(ValueError, match="3 layers"):
        ev.evaluate(targets=[1], fanouts=[5])
    with pytest.raises(ValueError, match="-7"):
        ev.evaluate(targets=[1], fanouts=[5, -7, 5])


def test_stats_report_stages_and_frontiers(setup):
    _, ev, _ = setup
    ev.evaluate(targets=[1, 2])
    stats = ev.last_stats
    assert len(stats.frontier_sizes) == ev.num_layers + 1
    assert stats.frontier_sizes[-1] == 2
    assert stats.batches >= ev.num_layers
    assert stats.compute_s > 0 and stats.total_s >= stats.compute_s
    d = stats.to_dict()
    assert {"prepare_s", "transfer_s", "compute_s", "write_out_s", "layers"} <= set(d)


def test_default_prefetch_starts_the_prefetch_thread(setup, monkeypatch):
    """Regression: with the default ``prefetch=None`` the pool checked the raw argument,
    so the device default (on for CUDA) never created the prefetch thread."""
    from hopserve.worker.engine import evaluator as evaluator_module

    store, _, want = setup
    monkeypatch.setattr(evaluator_module, "default_prefetch", lambda device: True)
    ev = LayerwiseEvaluator(build("sage_mean", 6), store, init_batch_nodes=40, self_check=False)
    try:
        assert ev.prefetch and ev._pool is not None
        assert_exact(ev.evaluate(), want, "prefetched")
    finally:
        ev.close()
    off = LayerwiseEvaluator(build("sage_mean", 6), store, prefetch=False, self_check=False)
    assert not off.prefetch and off._pool is None
