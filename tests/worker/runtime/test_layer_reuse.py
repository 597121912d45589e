"""A worker's layer cache under graph updates: every job equals the model's own forward on
the graph at the job's sequence, warm, cold, after updates that invalidate part of the
cache, and after a compaction (a new base store)."""

from __future__ import annotations

import random
from collections.abc import Callable

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
from hopserve.worker.runtime.base import LoadedModel

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


@pytest.fixture()
def live(graph_dir):
    """The living graph over ``graph_dir``, with features."""
    return open_live(graph_dir, with_features=True)


@pytest.fixture()
def cpu_worker():
    worker = make_worker("cpu", worker_id="reuse")
    yield worker
    worker.close()


@pytest.fixture()
def serve(live, cpu_worker) -> Callable[[str, int], LoadedModel]:
    """``serve(family, rows)``: a ``family`` model (seed 5) loaded on ``cpu_worker`` as
    ``m`` v1 over ``live``, with a layer cache of ``rows`` hub rows."""

    def load(family: str, rows: int) -> LoadedModel:
        model = build(family, DIM, seed=5)
        with live.reading():
            store = live.store()
        entry = cpu_worker.add_model("m", "1", model, store, EngineConfig(layer_cache_rows=rows))
        entry.live = live
        return entry

    return load


def _job(entry: LoadedModel, targets: np.ndarray, k: int, **kw) -> Job:
    live = entry.live
    return Job(
        f"job-{k}",
        entry.name,
        entry.version,
        np.unique(targets).astype(np.int64),
        graph_version=live.lineage_version,
        graph_seq=live.seq,
        **kw,
    )


def _reused(result) -> int:  # noqa: ANN001 - a worker's job result
    """Rows the job reused from the layer cache, over all layers."""
    return sum(s.reused_rows for s in result.stats.layers)


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
def test_jobs_stay_exact_through_updates_and_compaction(family, live, cpu_worker, serve):
    entry = serve(family, 16)
    rng, pyrng = np.random.default_rng(3), random.Random(4)
    reused = 0
    for k in range(14):
        if k % 3 == 2:
            live.apply(random_batch(pyrng, live_state(live), DIM))
        if k == 9:
            live.compact()
        n = live.topology.num_nodes
        targets = np.concatenate([[0, 1, 2], rng.integers(0, n, 5)])
        result = cpu_worker.execute(_job(entry, targets, k))
        want = _forward(family, live, targets)
        assert_exact(torch.from_numpy(result.embeddings), want, f"{family} job {k}")
        reused += _reused(result)
    assert reused > 0
    assert entry.layer_cache.cache.rows_kept() > 0


def test_sampling_and_delta_jobs_leave_the_cache_alone(cpu_worker, serve):
    entry = serve("sage_mean", 16)
    targets = np.arange(10)
    sampled = _job(entry, targets, 0, fanouts=(2, 2, 2), seed=1)
    cpu_worker.execute(sampled)
    assert entry.layer_cache.cache is None or entry.layer_cache.cache.rows_kept() == 0
    cpu_worker.execute(_job(entry, targets, 1))
    kept = entry.layer_cache.cache.rows_kept()
    assert kept > 0
    cpu_worker.execute(_job(entry, targets, 2, fanouts=(2, 2, 2), seed=1))
    assert entry.layer_cache.cache.rows_kept() == kept


def test_layer_cache_off(live, cpu_worker, serve):
    entry = serve("sage_mean", 0)
    assert entry.layer_cache is None
    result = cpu_worker.execute(_job(entry, np.arange(5), 0))
    assert_exact(
        torch.from_numpy(result.embeddings), _forward("sage_mean", live, np.arange(5)), "off"
    )


def test_a_job_that_carries_frontiers_runs_on_them(cpu_worker, serve):
    """Frontiers sent with a job are checked and used as sent; only jobs without any are
    planned around the cache (the front-end sends none to a worker with a layer cache)."""
    entry = serve("sage_mean", N)
    assert entry.status().layer_cache_rows == N
    targets = np.arange(6)
    cpu_worker.execute(_job(entry, targets, 0))  # warms the cache
    warm = cpu_worker.execute(_job(entry, targets, 1))
    assert _reused(warm) > 0
    plan = entry.evaluator.plan(torch.from_numpy(targets))
    sent = cpu_worker.execute(_job(entry, targets, 2, frontiers=plan.frontiers))
    assert _reused(sent) == 0
    assert sent.stats.frontier_sizes == plan.sizes(entry.graph.num_nodes)
    np.testing.assert_allclose(sent.embeddings, warm.embeddings, rtol=1e-5, atol=1e-6)
