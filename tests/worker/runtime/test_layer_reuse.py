"""A worker's layer cache under graph updates: every job equals the model's own forward on
the graph at the job's sequence, warm, cold, after updates that invalidate part of the
cache, and after a compaction (a new base store)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from support import assert_exact
from support.live_graph import build_store, live_state, random_batch
from support.models import build

from hopserve.config import EngineConfig
from hopserve.proto.contract import Job
from hopserve.worker.graph.live import forget_live, open_live
from hopserve.worker.runtime import make_worker

DIM = 6
N = 120


@pytest.fixture()
def graph_dir(tmp_path):
    rng = np.random.default_rng(1)
    hubs = [(int(s), int(rng.integers(0, 4))) for s in rng.integers(0, N, 200)]  # in-hubs 0..3
    rest = [(int(s), int(d)) for s, d in rng.integers(0, N, (260, 2))]
    path = tmp_path / "graph"
    build_store(hubs + rest, N, DIM, id_kind="sparse", seed=2, path=path)
    yield path
    forget_live(path)


def _job(live, entry, targets: np.ndarray, k: int, **kw) -> Job:
    return Job(
        f"job-{k}",
        entry.name,
        entry.version,
        np.unique(targets).astype(np.int64),
        graph_version=live.lineage_version,
        graph_seq=live.seq,
        **kw,
    )


def _forward(family: str, live, targets: np.ndarray) -> torch.Tensor:
    """A fresh model's own forward on the living graph now (storage order; fresh: a
    ``cached=True`` GCNConv keeps the normalization of the first graph it saw)."""
    model = build(family, DIM, seed=5)
    with live.reading():
        store = live.store()
        x = store.features[: store.num_nodes]
        with torch.no_grad():
            out = model(x, store.edge_index())
    return out[torch.from_numpy(np.unique(targets))]


@pytest.mark.parametrize("family", ["gcn", "sage_mean"])
def test_jobs_stay_exact_through_updates_and_compaction(family, graph_dir):
    model = build(family, DIM, seed=5)
    live = open_live(graph_dir, with_features=True)
    worker = make_worker("cpu", worker_id="reuse")
    try:
        with live.reading():
            store = live.store()
        entry = worker.add_model("m", "1", model, store, EngineConfig(layer_cache_rows=16))
        entry.live = live
        rng, pyrng = np.random.default_rng(3), random.Random(4)
        reused = 0
        for k in range(14):
            if k % 3 == 2:
                live.apply(random_batch(pyrng, live_state(live), DIM))
            if k == 9:
                live.compact()
            n = live.topology.num_nodes
            targets = np.concatenate([[0, 1, 2], rng.integers(0, n, 5)])
            result = worker.execute(_job(live, entry, targets, k))
            want = _forward(family, live, targets)
            assert_exact(torch.from_numpy(result.embeddings), want, f"{family} job {k}")
            reused += sum(s.reused_rows for s in result.stats.layers)
        assert reused > 0
        assert entry.layer_cache.cache.rows_kept() > 0
    finally:
        worker.close()


def test_sampling_and_delta_jobs_leave_the_cache_alone(graph_dir):
    model = build("sage_mean", DIM, seed=5)
    live = open_live(graph_dir, with_features=True)
    worker = make_worker("cpu", worker_id="reuse")
    try:
        with live.reading():
            store = live.store()
        entry = worker.add_model("m", "1", model, store, EngineConfig(layer_cache_rows=16))
        entry.live = live
        targets = np.arange(10)
        sampled = _job(live, entry, targets, 0, fanouts=(2, 2, 2), seed=1)
        worker.execute(sampled)
        assert entry.layer_cache.cache is None or entry.layer_cache.cache.rows_kept() == 0
        worker.execute(_job(live, entry, targets, 1))
        kept = entry.layer_cache.cache.rows_kept()
        assert kept > 0
        worker.execute(_job(live, entry, targets, 2, fanouts=(2, 2, 2), seed=1))
        assert entry.layer_cache.cache.rows_kept() == kept
    finally:
        worker.close()


def test_layer_cache_off(graph_dir):
    model = build("sage_mean", DIM, seed=5)
    live = open_live(graph_dir, with_features=True)
    worker = make_worker("cpu", worker_id="reuse")
    try:
        with live.reading():
            store = live.store()
        entry = worker.add_model("m", "1", model, store, EngineConfig(layer_cache_rows=0))
        entry.live = live
        assert entry.layer_cache is None
        result = worker.execute(_job(live, entry, np.arange(5), 0))
        assert_exact(
            torch.from_numpy(result.embeddings), _forward("sage_mean", live, np.arange(5)), "off"
        )
    finally:
        worker.close()


def test_a_job_that_carries_frontiers_runs_on_them(graph_dir):
    """Frontiers sent with a job are checked and used as sent; only jobs without any are
    planned around the cache (the front-end sends none to a worker with a layer cache)."""
    model = build("sage_mean", DIM, seed=5)
    live = open_live(graph_dir, with_features=True)
    worker = make_worker("cpu", worker_id="reuse")
    try:
        with live.reading():
            store = live.store()
        entry = worker.add_model("m", "1", model, store, EngineConfig(layer_cache_rows=N))
        entry.live = live
        assert entry.status().layer_cache_rows == N
        targets = np.arange(6)
        worker.execute(_job(live, entry, targets, 0))  # warms the cache
        warm = worker.execute(_job(live, entry, targets, 1))
        assert sum(s.reused_rows for s in warm.stats.layers) > 0
        plan = entry.evaluator.plan(torch.from_numpy(targets))
        sent = worker.execute(_job(live, entry, targets, 2, frontiers=plan.frontiers))
        assert sum(s.reused_rows for s in sent.stats.layers) == 0
        assert sent.stats.frontier_sizes == plan.sizes(store.num_nodes)
        np.testing.assert_allclose(sent.embeddings, warm.embeddings, rtol=1e-5, atol=1e-6)
    finally:
        worker.close()
