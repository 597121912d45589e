"""CPUWorker: exact and sampling jobs against the evaluator, errors, status."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from support import assert_exact
from support.servable import exact_job

from hopserve import LayerwiseEvaluator
from hopserve.proto.contract import (
    DeadlineExceededError,
    InvalidJobError,
    Job,
    ModelNotFoundError,
)
from hopserve.worker.loader import ModelLoadError
from hopserve.worker.runtime import CPUWorker, make_worker


@pytest.fixture(scope="module")
def evaluator(servable):
    return LayerwiseEvaluator(servable.model, servable.store, progress=False)


def _want(evaluator, store, targets, **kw) -> torch.Tensor:
    """The evaluator's own answer for storage ids ``targets`` (it takes external IDs)."""
    return evaluator.evaluate(store.to_external(torch.as_tensor(targets)), **kw)


@pytest.mark.parametrize("targets", [[3], [5, 0, 77, 42], list(range(0, 120, 3))])
def test_exact_job_equals_evaluator(worker, evaluator, servable, targets):
    store = servable.store
    res = worker.execute(exact_job(store, sorted(targets)))
    assert res.embeddings.dtype == np.float32 and res.embeddings.flags.c_contiguous
    got = torch.from_numpy(res.embeddings)
    assert_exact(got, _want(evaluator, store, sorted(targets)), "vs evaluator")
    assert_exact(got, servable.reference[sorted(targets)], "vs full-graph forward")
    assert res.job_id == "j" and res.worker == "test-worker"
    assert len(res.stats.frontier_sizes) == 3 and res.stats.frontier_sizes[-1] == len(targets)
    assert res.stats.batches >= 2 and res.stats.total_s > 0
    assert len(res.stats.layer_compute_s) == len(evaluator.last_stats.layers)
    assert res.stats.peak_bytes > 0


def test_rows_follow_target_order_with_duplicates(worker, servable):
    targets = [90, 4, 4, 17]
    job = Job("d", "tiny", "1", np.array(targets))  # the worker plans
    got = torch.from_numpy(worker.execute(job).embeddings)
    assert_exact(got, servable.reference[targets], "order + duplicates")


def test_all_nodes_frontiers_and_one_frontier_per_layer(worker, servable):
    targets = np.array([1, 2, 60])
    full = exact_job(servable.store, targets)
    all_nodes = Job("a", "tiny", "1", targets, frontiers=(None, None, targets))
    for job in (all_nodes, full):
        got = torch.from_numpy(worker.execute(job).embeddings)
        assert_exact(got, servable.reference[targets], job.job_id)
    # The worker never plans an exact job again: V^1, V^2 without V^0 is refused, not completed.
    short = Job("p", "tiny", "1", targets, frontiers=full.frontiers[1:])
    with pytest.raises(InvalidJobError, match=r"2 frontiers for a 2-layer model \(expected 3"):
        worker.execute(short)


def test_sampling_job_is_reproducible(worker, evaluator, servable):
    targets = np.array([0, 8, 33, 101])
    job = Job("s", "tiny", "1", targets, fanouts=(2, 2), seed=5)
    a = worker.execute(job).embeddings
    b = worker.execute(job).embeddings
    np.testing.assert_array_equal(a, b)
    want = _want(evaluator, servable.store, targets, fanouts=[2, 2], seed=5)
    assert_exact(torch.from_numpy(a), want, "sampling vs evaluator")
    other = worker.execute(Job("s2", "tiny", "1", targets, fanouts=(2, 2), seed=6)).embeddings
    assert not np.array_equal(a, other)
    exact_all = worker.execute(Job("s3", "tiny", "1", targets, fanouts=(-1, -1))).embeddings
    assert_exact(torch.from_numpy(exact_all), servable.reference[targets], "fanout -1 = exact")


def test_unknown_model_or_version_is_named(worker):
    for model, version in (("nope", "1"), ("tiny", "9")):
        with pytest.raises(ModelNotFoundError, match=f"'{model}' version '{version}'") as info:
            worker.execute(Job("u", model, version, np.array([1])))
        assert "tiny:1" in str(info.value)  # lists what is loaded


def test_expired_deadline_is_refused(worker):
    job = Job("late", "tiny", "1", np.array([1]), deadline=time.time() - 1)
    with pytest.raises(DeadlineExceededError, match="late"):
        worker.execute(job)


def test_deadline_passes_while_waiting_for_the_model(worker, servable):
    entry = worker.model("tiny", "1")
    entry.lock.acquire()  # another job holds the model
    try:
        job = Job("w", "tiny", "1", np.array([1]), deadline=time.time() + 0.2)
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceededError, match="waiting"):
            worker.execute(job)
        assert time.monotonic() - t0 < 2
        assert worker.inflight == 0
    finally:
        entry.lock.release()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"targets": np.array([1, 120])}, r"outside 0\.\.119: \[120\]"),
        ({"targets": np.array([], dtype=np.int64)}, "empty"),
        ({"targets": np.array([[1]])}, "1-D"),
        ({"frontiers": (None, np.array([5, 3]), np.array([3]))}, "V\\^1: not strictly ascending"),
        ({"frontiers": (None, None, np.array([4]))}, r"targets not contained in V\^2: \[3\]"),
        ({"frontiers": (None, np.array([4]), np.array([3]))}, r"V\^2 not contained in V\^1"),
        ({"frontiers": (np.array([3]), None, np.array([3]))}, "V\\^1 is all nodes but V\\^0"),
        ({"frontiers": (None,) * 4}, "4 frontiers for a 2-layer model"),
        ({"frontiers": (None, np.array([], dtype=np.int64), None)}, "empty"),
        ({"fanouts": (3,)}, "2 layers"),
        ({"fanouts": (3, -4)}, "-4"),
    ],
)
def test_malformed_jobs_are_refused(worker, change, match):
    base = {"targets": np.array([3])}
    job = Job("bad", "tiny", "1", **{**base, **change})
    with pytest.raises(InvalidJobError, match=match):
        worker.execute(job)


def test_verify_frontiers_catches_missing_neighbours(servable):
    w = CPUWorker(verify_frontiers=True)
    w.load_model(servable.config())
    store = servable.store
    job = exact_job(store, [7])
    v1 = job.frontiers[1]
    assert v1.size > 1
    broken = Job("v", "tiny", "1", job.targets, frontiers=(None, np.array([7]), job.frontiers[2]))
    with pytest.raises(InvalidJobError, match=r"in-neighbours of V\^2 not contained in V\^1"):
        w.execute(broken)
    w.execute(job)  # the planner's frontiers pass
    w.close()


def test_status_reports_models_and_memory(worker, servable):
    info = worker.status()
    assert info.worker_id == "test-worker" and info.device == "cpu"
    (model,) = info.models
    assert (model.name, model.version, model.dim, model.num_layers, model.mode) == (
        "tiny",
        "1",
        4,
        2,
        "layerwise",
    )
    assert model.reads_input_frontier is False  # TinySAGE has no node-wise block 0
    assert (model.graph_version, model.graph_num_nodes) == (servable.store.version, 120)
    assert [(b.layer, b.kind, b.in_dim, b.out_dim) for b in model.blocks] == [
        (1, "SAGEConv", 6, 8),
        (2, "SAGEConv", 8, 4),
    ]
    assert info.inflight_jobs == 0 and info.queued_jobs == 0
    mem = info.memory
    assert 0 < mem.used < mem.total and mem.peak >= mem.used // 2


def test_models_run_concurrently_and_correctly(servable):
    w = make_worker("cpu", num_threads=1)
    w.load_model(servable.config(name="a"))
    w.load_model(servable.config(name="b", version="2"))
    assert set(w.models) == {("a", "1"), ("b", "2")}
    results: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def run(name: str, version: str, i: int) -> None:
        try:
            job = Job(f"{name}{i}", name, version, np.array([i, 50 + i]))
            results[job.job_id] = w.execute(job).embeddings
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [
        threading.Thread(target=run, args=(n, v, i))
        for i in range(4)
        for n, v in (("a", "1"), ("b", "2"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    for i in range(4):
        for n in "ab":
            want = servable.reference[[i, 50 + i]]
            assert_exact(torch.from_numpy(results[f"{n}{i}"]), want, f"{n}{i}")
    w.close()


def test_load_errors_name_the_model(servable, tmp_path):
    w = CPUWorker()
    with pytest.raises(ModelLoadError, match="model 'tiny'.*graph"):
        w.load_model(servable.config(graph=tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="model 'tiny'.*rejected kwargs"):
        w.load_model(servable.config(kwargs={"in_dim": 6, "bogus": 1}))


def test_make_worker_picks_the_class():
    assert isinstance(make_worker("cpu"), CPUWorker)
    with pytest.raises(ValueError, match="tpu"):
        make_worker("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            make_worker("cuda:0")


def test_refused_model_says_how_to_serve_it_and_the_config_fallback_serves_it(servable):
    """Regression: refusals recommended `fallback='nodewise'`, a key the YAML config did
    not have."""
    from hopserve.config import ModelConfig

    fields = servable.config().model_dump() | {
        "entrypoint": "support.servable:TinyAPPNP",
        "weights": None,
    }
    worker = make_worker("cpu", worker_id="fallback")
    try:
        with pytest.raises(ModelLoadError, match="`fallback: nodewise` in the model's config"):
            worker.load_model(ModelConfig(**fields))
        loaded = worker.load_model(ModelConfig(**fields | {"fallback": "nodewise"}))
        assert loaded.evaluator.mode == "nodewise"
        store = servable.store
        with torch.no_grad():
            want = loaded.evaluator.model(store.features, store.edge_index())
        targets = [5, 0, 77, 77]
        got = worker.execute(Job("n", "tiny", "1", np.array(targets))).embeddings
        assert_exact(torch.from_numpy(got), want[targets], "node-wise via config")
    finally:
        worker.close()
