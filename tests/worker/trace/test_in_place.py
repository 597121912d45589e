"""``writes_into_inputs`` (``ConvBlock.writes_in_place``): which blocks may be handed views
of stored values and of the graph's features."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_graph
from support.models import ReadAndWrite, SkipCat

from hopserve import LayerwiseEvaluator
from hopserve.worker.trace.split import split_model


def _last_block(tail: str):
    return split_model(SkipCat(tail), 6).blocks[-1]


@pytest.mark.parametrize("tail", ["none", "method", "function", "out", "keyword", "module"])
def test_writes_into_the_block_s_own_tensors_are_no_writes_into_inputs(tail):
    assert not _last_block(tail).writes_in_place, tail


@pytest.mark.parametrize("tail", ["input-method", "input-out", "input-aten", "input-helper"])
def test_every_kind_of_write_into_an_input_is_seen(tail):
    block = _last_block(tail)
    assert any(spec.rows == "dst" for spec in block.inputs)
    assert block.writes_in_place, tail


def test_a_layer_read_by_a_conv_and_written_in_the_same_block_is_not_shared():
    """The block gets copies, not the whole table: a batch's write into its destination
    rows would reach the next batch's conv. Exact, and the stored layer is left alone."""
    edge_index, x, store = random_graph(900, 7000, 6, seed=12, x_seed=13)
    torch.manual_seed(0)
    model = ReadAndWrite().eval()
    ev = LayerwiseEvaluator(model, store, memory_budget_bytes=60_000, init_batch_nodes=64)
    assert ev.split.blocks[-1].writes_in_place
    with torch.no_grad():
        want = model(x.clone(), edge_index)
        assert_exact(ev.evaluate(), want, "read and written")
        assert_exact(ev.evaluate(), want, "twice")
    assert not ev.last_stats.layers[-1].gather_free
    assert ev.last_stats.layers[-1].batches > 1
