"""The final layer of a full evaluation in many batches: rows written in storage order, then
one gather into external-ID order (a scatter per batch is single-threaded); a final output
spilled to disk keeps the scatter. Both equal the model's forward in external-ID order."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact
from support.models import OneConv, build

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.engine.run import LayerwiseRun


@pytest.fixture(scope="module")
def reordered():
    from support import random_edge_index

    edge_index = random_edge_index(700, 5000, seed=21)
    x = torch.randn(700, 6, generator=torch.Generator().manual_seed(22))
    return edge_index, x, GraphStore.from_edge_index(edge_index, x, reorder="rcmk")


def _gathers(monkeypatch) -> list[bool]:
    """Whether each run's final output waited for the gather (spied on ``_order_final``)."""
    seen: list[bool] = []
    real = LayerwiseRun._order_final

    def spy(self):
        seen.append(self._final_storage_order)
        real(self)

    monkeypatch.setattr(LayerwiseRun, "_order_final", spy)
    return seen


@pytest.mark.parametrize("family", ["sage_mean", "gcn", "jk_cat"])
def test_storage_order_then_one_gather(family, reordered, monkeypatch):
    edge_index, x, store = reordered
    assert not torch.equal(store.node_ids, torch.arange(700))  # really reordered
    model = build(family, 6)
    seen = _gathers(monkeypatch)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=50, progress=False)
    seen.clear()  # the load's self-check ran the model too
    with torch.no_grad():
        want = model(x, edge_index)
    assert_exact(ev.evaluate(), want, f"{family} full")
    assert ev.last_stats.layers[-1].batches > 1 and seen == [True]
    targets = torch.tensor([699, 3, 3, 250])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family} partial")
    assert seen == [True, False]  # partial: rows in target order, written as they come


def test_a_final_output_on_disk_keeps_the_scatter(reordered, monkeypatch, tmp_path):
    edge_index, x, store = reordered
    model = build("sage_mean", 6)
    seen = _gathers(monkeypatch)
    ev = LayerwiseEvaluator(
        model, store, init_batch_nodes=50, progress=False, host_memory_budget_bytes=1024,
        spill_dir=str(tmp_path),
    )  # fmt: skip
    seen.clear()
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "final output on disk")
    assert seen == [False] and ev.last_stats.tiers[ev.split.output] == "disk"


def test_no_room_for_the_gather_keeps_the_scatter(reordered, monkeypatch):
    """A host budget with room for the final output but not for the gather's second
    buffer beside it: the rows are scattered batch by batch, on the host tier, exact (one
    SAGE layer: its input is the store's features, so the output is all the run holds)."""
    from torch_geometric.nn import SAGEConv

    edge_index, x, store = reordered
    torch.manual_seed(3)
    model = OneConv(SAGEConv(6, 5)).eval()
    out_bytes = store.num_nodes * 5 * 4
    for budget, gathers in ((2 * out_bytes, True), (2 * out_bytes - 1, False)):
        seen = _gathers(monkeypatch)
        ev = LayerwiseEvaluator(
            model, store, init_batch_nodes=50, progress=False, host_memory_budget_bytes=budget
        )
        seen.clear()
        with torch.no_grad():
            assert_exact(ev.evaluate(), model(x, edge_index), f"host budget {budget}")
        assert seen == [gathers] and ev.last_stats.tiers[ev.split.output] == "host"
