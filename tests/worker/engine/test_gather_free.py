"""Gather-free batches: conv-only inputs are read in place and results stay exact."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_graph
from support.models import build

from hopserve import LayerwiseEvaluator
from hopserve.worker.convs import gcn


@pytest.fixture(scope="module")
def graph():
    return random_graph(900, 7000, 6, seed=12, x_seed=13)


FULL_LAYER_FAMILIES = ["gcn", "gcn_improved", "gcn_noloops"]  # x Θ once per full layer


@pytest.mark.parametrize(
    "family", ["sage_mean", "sage_sum", "gin", "graphconv", *FULL_LAYER_FAMILIES]
)
def test_full_evaluation_reads_in_place_and_is_exact(graph, family):
    edge_index, x, store = graph
    model = build(family, 6)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=64)
    with torch.no_grad():
        assert_exact(ev.evaluate(), build(family, 6)(x, edge_index), family)
    conv_layers = [layer for layer in ev.last_stats.layers if layer.layer > 0]
    assert any(layer.gather_free for layer in conv_layers)
    assert ev.last_stats.batches > len(ev.last_stats.layers)  # several batches per layer


@pytest.mark.parametrize("family", FULL_LAYER_FAMILIES)
def test_full_layer_edge_weights_built_in_chunks_are_exact(graph, family, monkeypatch):
    """The normalized weights of a full layer are built a run of destinations at a time;
    chunk edges (97 edges, runs cut mid-graph) must not change them."""
    edge_index, x, store = graph
    monkeypatch.setattr(gcn, "FULL_WEIGHT_CHUNK_EDGES", 97)
    ev = LayerwiseEvaluator(build(family, 6), store, init_batch_nodes=64)
    with torch.no_grad():
        assert_exact(ev.evaluate(), build(family, 6)(x, edge_index), f"{family}, chunked")


@pytest.mark.parametrize("family", FULL_LAYER_FAMILIES)
def test_full_layer_only_adapters_gather_on_partial_frontiers(graph, family):
    """GCN derives x Θ for the whole table: a partial frontier must not pay for that."""
    edge_index, x, store = graph
    ev = LayerwiseEvaluator(build(family, 6), store, init_batch_nodes=64)
    ids = torch.tensor([3, 5, 899])
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), build(family, 6)(x, edge_index)[ids], family)
    assert not any(layer.gather_free for layer in ev.last_stats.layers)


def test_partial_evaluation_gathers(graph):
    edge_index, x, store = graph
    model = build("sage_mean", 6)
    ev = LayerwiseEvaluator(model, store)
    ids = torch.tensor([3, 5])
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), model(x, edge_index)[ids], "partial")
    assert not ev.last_stats.layers[-1].gather_free  # V^L is a subset: stored by position


def test_attention_convs_without_a_full_layer_path_gather(graph):
    """GATv2 scores each edge from both endpoints' projected rows: it runs its own forward
    on gathered rows (GATConv's full layers read a source table: tests/worker/convs)."""
    _, _, store = graph
    ev = LayerwiseEvaluator(build("gatv2", 6), store)
    ev.evaluate()
    assert not any(layer.gather_free for layer in ev.last_stats.layers)


def test_residual_reads_destination_rows_of_the_table(graph):
    # JKNet adds the conv input back: the residual reads destination rows, which in the
    # gather-free path are a view of the stored table — still exact.
    edge_index, x, store = graph
    model = build("jk_cat", 6)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=50)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "jk")
    assert any(layer.gather_free for layer in ev.last_stats.layers)
