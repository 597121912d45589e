"""End to end on a GPU worker (skipped without CUDA): client SDK → gRPC → front-end →
batcher → the in-process worker on ``cuda:0``; rows equal the model's own full-graph
forward on the CPU, cold and through the cache, under concurrent requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from support import assert_exact
from support.e2e import MODEL, pick

from hopserve import GraphStore

from .conftest import KWARGS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def reference(graph_dir, weights) -> torch.Tensor:
    """The model's own forward on the whole graph (CPU), rows in storage order."""
    from support.models import GraphSAGE

    model = GraphSAGE(**KWARGS)
    model.load_state_dict(torch.load(weights, weights_only=True))
    store = GraphStore.open(graph_dir)
    with torch.no_grad():
        return model.eval()(store.features.float(), store.edge_index())


def rows_of(reference: torch.Tensor, store: GraphStore, ids: np.ndarray) -> torch.Tensor:
    return reference[store.to_storage(torch.from_numpy(ids))]


def test_a_gpu_worker_serves_exact_rows(start_server, make_config, reference, graph_dir, all_ids):
    server = start_server(make_config(model={"device": "cuda:0"}, max_batch_targets=32))
    store = GraphStore.open(graph_dir)
    ids = pick(all_ids, 3, 50)
    with server.client() as client:
        cold = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
        assert_exact(torch.from_numpy(cold.embeddings), rows_of(reference, store, ids), "gpu cold")
        first = client.get_embeddings(MODEL, ids)
        server.drain()
        cached = client.get_embeddings_with_info(MODEL, ids)
    assert cached.cache_hits == len(ids)
    assert cached.embeddings.tobytes() == first.tobytes()

    sets = [pick(all_ids, 100 + i, 20) for i in range(24)]  # coalesced into shared batches
    with server.client() as client, ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda s: client.get_embeddings(MODEL, s, cache_policy="bypass"), sets)
        )
    for s, got in zip(sets, answers, strict=True):
        assert_exact(torch.from_numpy(got), rows_of(reference, store, s), "gpu concurrent")
    assert torch.cuda.max_memory_allocated(0) > 0  # the in-process worker computed there
