"""A batch's union is planned once; every request's frontiers are inside it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import random_edge_index

from hopserve import GraphStore
from hopserve.config import ModelConfig
from hopserve.proto.contract import ModelStatus
from hopserve.server.batcher import BatchKey
from hopserve.server.metrics import Metrics
from hopserve.server.models import ServedModel
from hopserve.server.pipeline import plan_batch
from hopserve.worker.graph.planner import plan_frontiers

N = 300
LAYERS = 2


@pytest.fixture(scope="module")
def graph() -> GraphStore:
    return GraphStore.from_edge_index(random_edge_index(N, 600, seed=3), torch.zeros(N, 4))


@pytest.fixture(scope="module")
def model(graph: GraphStore, tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    config = ModelConfig(name="m", entrypoint="a.b:C", graph=tmp_path_factory.mktemp("g"))
    served = ServedModel(config, graph.topology)
    served.adopt(ModelStatus("m", "1", 4, LAYERS, graph.version, N))
    return served


def as_set(frontier: np.ndarray | None) -> set[int]:
    return set(range(N)) if frontier is None else set(frontier.tolist())


def test_union_frontiers_equal_plan_of_the_union(graph: GraphStore, model: ServedModel) -> None:
    metrics = Metrics(process_collectors=False)
    requests = [np.array([5, 17, 40]), np.array([17, 200]), np.array([3])]
    union = np.unique(np.concatenate(requests))
    planned, _ = plan_batch(model, union, BatchKey(), metrics)
    want = plan_frontiers(graph.topology, union, LAYERS)
    assert planned is not None and len(planned.frontiers) == LAYERS + 1
    for got, layer in zip(planned.frontiers, want.layers, strict=True):
        if layer.nodes is None:
            assert got is None
        else:
            assert got is not None and got.dtype == np.int64
            np.testing.assert_array_equal(got, layer.nodes)
    np.testing.assert_array_equal(planned.frontiers[-1], union)  # V^L = the targets
    sizes = planned.sizes(N)
    assert sizes == want.sizes(N)
    # each request's own frontiers are contained in the union's (one pass serves all)
    for ids in requests:
        own = plan_frontiers(graph.topology, ids, LAYERS)
        for layer, got in zip(own.layers, planned.frontiers, strict=True):
            assert as_set(layer.nodes) <= as_set(got)
    # one observation per layer in hopserve_frontier_nodes, plus the planning stage
    for layer, size in enumerate(sizes):
        labels = {"model": "m", "layer": str(layer)}
        assert metrics.registry.get_sample_value("hopserve_frontier_nodes_sum", labels) == size
    labels = {"model": "m", "stage": "planning"}
    assert metrics.registry.get_sample_value("hopserve_stage_duration_seconds_count", labels) == 1


def test_large_union_takes_the_all_nodes_shortcut(model: ServedModel) -> None:
    planned, _ = plan_batch(model, np.arange(0, N, 2), BatchKey())
    assert planned is not None
    assert planned.frontiers[0] is None  # DGI shortcut: "all nodes"
    assert planned.sizes(N)[0] == N


def test_sampling_batches_are_left_to_the_worker(model: ServedModel) -> None:
    planned, seconds = plan_batch(model, np.array([1, 2]), BatchKey((3, 3), 7))
    assert planned is None and seconds == 0.0
