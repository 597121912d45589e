"""Layers computed in one batch: the conv's output is kept as the layer's value (no copy,
no second layer-sized buffer), a full layer's block is built once per run, and every row
stays exact — in storage order, through the final gather into external-ID order, and when
the host tier is full and the layer must go to disk."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_edge_index
from support.models import build

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.engine import batch as batch_module
from hopserve.worker.engine.run import _owns_storage
from hopserve.worker.engine.storage import TierAllocator

ONE_BATCH = {"memory_budget_bytes": 1 << 30, "init_batch_nodes": 1 << 20}  # a layer a batch
FAMILIES = ["gcn", "sage_mean", "gat", "gin", "jk_cat", "two_convs_one_layer"]


@pytest.fixture(scope="module")
def graph():
    edge_index = random_edge_index(700, 5000, seed=31)
    x = torch.randn(700, 6, generator=torch.Generator().manual_seed(32))
    return edge_index, x


@pytest.fixture
def allocations(monkeypatch):
    """Names of the layer tensors the run allocates (and copies into)."""
    names: list[str] = []
    real = TierAllocator.allocate

    def spy(self, name, shape, dtype):
        names.append(name)
        return real(self, name, shape, dtype)

    monkeypatch.setattr(TierAllocator, "allocate", spy)
    return names


def _conv_outputs(ev: LayerwiseEvaluator) -> set[str]:
    return {name for block in ev.split.blocks if block.index > 0 for name in block.outputs}


@pytest.mark.parametrize("reorder", [None, "rcmk"])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_batch_layers_keep_their_outputs_and_stay_exact(graph, family, reorder, allocations):
    edge_index, x = graph
    store = GraphStore.from_edge_index(edge_index, x, reorder=reorder)
    model = build(family, 6)
    with torch.no_grad():
        want = model(x, edge_index)
    ev = LayerwiseEvaluator(model, store, **ONE_BATCH)
    allocations.clear()  # the load-time self-check runs a probe graph
    got = ev.evaluate()
    assert_exact(got, want, f"{family} one batch a layer ({reorder})")
    layers = [ly for ly in ev.last_stats.layers if ly.layer > 0]
    assert all(ly.batches == 1 for ly in layers), [ly.batches for ly in layers]
    # every conv block's outputs were adopted: nothing allocated for them, nothing copied
    assert not _conv_outputs(ev) & set(allocations), allocations
    assert set(ev.last_stats.tiers.values()) <= {"host"}, ev.last_stats.tiers
    # the caller owns the result: no layer of the run (nor a cache) shares its memory
    got.zero_()
    assert_exact(ev.evaluate(), want, f"{family} again")
    targets = torch.tensor([699, 0, 17, 17, 350])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family} partial")


@pytest.mark.parametrize("family", ["gcn", "sage_mean"])
def test_one_batch_layers_spill_to_disk_when_the_host_tier_is_full(graph, family, allocations):
    """No host budget: the adopted path is refused and each layer goes to a disk memmap."""
    edge_index, x = graph
    store = GraphStore.from_edge_index(edge_index, x, reorder="rcmk")
    model = build(family, 6)
    with torch.no_grad():
        want = model(x, edge_index)
    ev = LayerwiseEvaluator(model, store, host_memory_budget_bytes=0, **ONE_BATCH)
    allocations.clear()
    assert_exact(ev.evaluate(), want, f"{family} spilled")
    assert _conv_outputs(ev) <= set(allocations)
    assert set(ev.last_stats.tiers.values()) == {"disk"}, ev.last_stats.tiers


def test_full_layers_of_one_batch_build_their_block_once_per_run(graph, monkeypatch):
    """The block of a one-batch full layer is the whole graph's: every later full layer of
    the run reuses it (as a whole-graph forward reuses its graph), the next run builds it
    again."""
    edge_index, x = graph
    store = GraphStore.from_edge_index(edge_index, x, reorder="rcmk")
    model = build("sage_mean", 6)  # three gather-free full layers
    with torch.no_grad():
        want = model(x, edge_index)
    ev = LayerwiseEvaluator(model, store, **ONE_BATCH)
    built: list[tuple[int, int, int]] = []
    real = batch_module.build_batch

    def spy(graph, frontier, start, end, layer, *args, **kwargs):
        built.append((layer, start, end))
        return real(graph, frontier, start, end, layer, *args, **kwargs)

    monkeypatch.setattr(batch_module, "build_batch", spy)
    for run in range(2):
        built.clear()
        assert_exact(ev.evaluate(), want, f"run {run}")
        layers = [ly for ly in ev.last_stats.layers if ly.layer > 0]
        assert len(layers) >= 2 and all(ly.gather_free for ly in layers)
        assert [b for b in built if b[0] > 0] == [(1, 0, store.num_nodes)], built


def test_owns_storage():
    fresh = torch.randn(5, 3)
    other = torch.randn(5, 3)
    assert _owns_storage(fresh, (other,))
    assert not _owns_storage(fresh[1:], (other,))  # a view
    assert not _owns_storage(other.view(5, 3), ())  # a view of another tensor
    alias = torch.empty(0)
    alias.set_(fresh.untyped_storage(), 0, fresh.shape, fresh.stride())
    assert not _owns_storage(alias, (fresh,))  # shares its storage with an input
    assert not _owns_storage(fresh.t(), ())  # not contiguous
