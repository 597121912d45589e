"""End to end: client SDK → gRPC → front-end → cache / batcher / planner → engine.

Real components throughout (see ``conftest.py``). Expected embeddings come from running
the engine directly (``LayerwiseEvaluator.evaluate``) on the same graph and weights.
Requests the SDK would refuse before sending go through the raw gRPC stub.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.processes import start_serve

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.client import (
    DeadlineExceededError,
    EmbeddingClient,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.proto.v1 import embedding_pb2_grpc

MODEL = "sage"
ATOL, RTOL = 1e-5, 1e-4
REDIS_LABELS = {"model": MODEL, "backend": "redis"}


def expected(evaluator: LayerwiseEvaluator, ids: Any, **kw: Any) -> np.ndarray:
    return evaluator.evaluate(
        torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)), **kw
    ).numpy()


def raw(
    target: str,
    request: Any,
    method: str = "GetEmbeddings",
    timeout: float | None = 10.0,
) -> Any:
    """Call ``method`` with the generated stub (no client-side validation); a stream is
    returned as the list of its chunks."""
    with grpc.insecure_channel(target) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        answer = getattr(stub, method)(request, timeout=timeout)
        return list(answer) if method == "StreamEmbeddings" else answer


def raw_error(target: str, request: Any, method: str = "GetEmbeddings", **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        raw(target, request, method, **kw)
    return info.value


def request(ids: Any, model: str = MODEL, **options: Any) -> pb.GetEmbeddingsRequest:
    return pb.GetEmbeddingsRequest(
        model=model,
        node_ids=[int(i) for i in ids],
        options=pb.QueryOptions(**options),
    )


def pick(all_ids: np.ndarray, seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(all_ids, size=n, replace=True)


# ----------------------------------------------------------------------------- exact


def test_served_embeddings_equal_the_engine(served, evaluator, all_ids) -> None:
    ids = pick(all_ids, 0, 40)  # random order, with duplicates
    with served.client() as client:
        result = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
    np.testing.assert_allclose(result.embeddings, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
    assert result.embeddings.shape == (40, 5)
    assert result.model == MODEL and result.model_version == "1"
    assert (
        result.graph_version
        == GraphStore.open(served.service.models.get(MODEL).topology.path).version
    )
    assert result.cache_hits == 0
    timing = result.timing
    assert timing["total"] > 0 and timing["compute"] > 0 and timing["queue_wait"] > 0
    assert len(result.layer_compute) == 3


def test_cache_hit_path_returns_the_same_bytes(served, redis_server, all_ids) -> None:
    ids = all_ids[[5, 9, 5, 120]]
    hits_before = served.sample("hopserve_cache_hits_total", **REDIS_LABELS)
    with served.client() as client:
        first = client.get_embeddings_with_info(MODEL, ids)
        served.drain()  # the write-back runs after answering
        second = client.get_embeddings_with_info(MODEL, ids)
    assert first.cache_hits == 0
    assert second.cache_hits == len(ids)
    assert second.embeddings.tobytes() == first.embeddings.tobytes()
    assert second.timing["compute"] == 0 and second.timing["cache_lookup"] > 0
    assert served.sample("hopserve_cache_hits_total", **REDIS_LABELS) - hits_before == 3


@pytest.mark.parametrize("fill", [np.nan, 0.0, 1e30])
def test_corrupted_cache_values_are_recomputed_never_served(
    make_config, start_server, redis_server, evaluator, all_ids, fill
) -> None:
    """Regression: cached values overwritten with NaN, zeros or 1e30 of the right length
    were served as embeddings (429 of 429); now each is a miss, recomputed, overwritten
    and counted."""
    import redis

    server = start_server(make_config(cache={"redis_url": redis_server}))
    ids = all_ids[:40]
    want = expected(evaluator, ids)
    with server.client() as client:
        client.get_embeddings(MODEL, ids)
        server.drain()
        store = redis.Redis.from_url(redis_server)
        keys = store.keys(f"hopserve:{MODEL}:*")
        assert len(keys) == len(ids)
        for key in keys:
            value = store.get(key)
            row = np.full(5, fill, dtype="<f4").tobytes()
            store.set(key, value[: len(value) - len(row)] + row)
        got = client.get_embeddings_with_info(MODEL, ids)
        np.testing.assert_allclose(got.embeddings, want, atol=ATOL, rtol=RTOL)
        assert got.cache_hits == 0
        rejected = server.sample("hopserve_cache_rejected_total", reason="checksum", **REDIS_LABELS)
        assert rejected == len(ids)
        server.drain()  # the write-back overwrote every bad value
        again = client.get_embeddings_with_info(MODEL, ids)
        assert again.cache_hits == len(ids)
        np.testing.assert_allclose(again.embeddings, want, atol=ATOL, rtol=RTOL)


def test_refresh_recomputes_and_bypass_neither_reads_nor_writes(
    served, redis_proc, redis_server, all_ids
) -> None:
    ids = all_ids[[1, 2, 3]]
    with served.client() as client, redis_proc.client() as redis:
        bypass = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
        served.drain()
        assert bypass.cache_hits == 0 and redis.dbsize() == 0  # nothing written
        refresh = client.get_embeddings_with_info(MODEL, ids, cache_policy="refresh")
        served.drain()
        assert refresh.cache_hits == 0 and redis.dbsize() == 3  # written back
        again = client.get_embeddings_with_info(MODEL, ids, cache_policy="refresh")
        assert again.cache_hits == 0  # refresh never reads
        used = client.get_embeddings_with_info(MODEL, ids, cache_policy="use")
        assert used.cache_hits == 3
        bypass = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
        assert bypass.cache_hits == 0  # bypass never reads
    for result in (refresh, again, used, bypass):
        np.testing.assert_array_equal(result.embeddings, refresh.embeddings)


def test_concurrent_requests_coalesce_into_shared_batches(served, evaluator, all_ids) -> None:
    def scrape() -> tuple[float, float]:
        url = f"http://127.0.0.1:{served.service.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        values = [
            float(re.search(rf'^hopserve_batch_requests_{s}{{model="sage"}} (\S+)$', text, re.M)[1])
            for s in ("sum", "count")
        ]
        return values[0], values[1]

    sum0, count0 = scrape()
    barrier = threading.Barrier(8)
    results: dict[int, np.ndarray] = {}
    requests = {k: all_ids[[k, k + 30, k + 60]] for k in range(8)}

    def one(k: int) -> None:
        with served.client() as client:
            barrier.wait()
            results[k] = client.get_embeddings(MODEL, requests[k], cache_policy="bypass")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sum1, count1 = scrape()
    assert sum1 - sum0 == 8  # every request rode in exactly one batch
    assert (sum1 - sum0) / (count1 - count0) > 1  # ... and batches were shared
    for k, ids in requests.items():
        np.testing.assert_allclose(results[k], expected(evaluator, ids), atol=ATOL, rtol=RTOL)


def test_large_request_is_split_into_several_batches(served, evaluator, all_ids) -> None:
    before = served.sample("hopserve_batch_requests_count", model=MODEL)
    ids = all_ids[::-1][:150]  # > max_batch_targets (64) unique targets
    with served.client() as client:
        got = client.get_embeddings(MODEL, ids, cache_policy="bypass")
    np.testing.assert_allclose(got, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
    assert served.sample("hopserve_batch_requests_count", model=MODEL) - before == 3


# ----------------------------------------------------------------------------- stream


def test_stream_reassembles_to_get_embeddings(served, all_ids) -> None:
    served.service.edge.max_chunk_bytes = 7 * 5 * 4  # 7 rows per chunk
    try:
        ids = np.concatenate([pick(all_ids, 3, 100), all_ids[:3]])
        with served.client() as client:
            whole = client.get_embeddings(MODEL, ids, cache_policy="bypass")
            pieces = list(client.stream_embeddings(MODEL, ids, cache_policy="bypass"))
        chunks = raw(served.target, request(ids), "StreamEmbeddings")
    finally:
        served.service.edge.max_chunk_bytes = 2 << 20
    assert [off for off, _ in pieces] == list(range(0, 103, 7))
    np.testing.assert_allclose(np.concatenate([rows for _, rows in pieces]), whole, atol=0)
    assert all(c.num_rows <= 7 and c.num_nodes == 103 and c.dim == 5 for c in chunks)
    assert [c.HasField("timing") for c in chunks] == [False] * (len(chunks) - 1) + [True]
    rows = np.concatenate([decode_embeddings(c.embeddings, c.num_rows, c.dim) for c in chunks])
    np.testing.assert_array_equal(rows, whole)


# ----------------------------------------------------------------------------- sampling


def test_sampled_requests_are_reproducible_and_match_the_engine(served, evaluator, all_ids) -> None:
    ids = all_ids[[4, 50, 4, 77]]
    with served.client() as client:
        a = client.get_embeddings_with_info(MODEL, ids, fanouts=[2, 2, 2], seed=7)
        b = client.get_embeddings_with_info(MODEL, ids, fanouts=[2, 2, 2], seed=7)
        other = client.get_embeddings(MODEL, ids, fanouts=[2, 2, 2], seed=8)
        unseeded = client.get_embeddings(MODEL, ids, fanouts=[2, 2, 2])
        all_neighbours = client.get_embeddings(MODEL, ids, fanouts=[-1, -1, -1])
        exact = client.get_embeddings(MODEL, ids, cache_policy="bypass")
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    assert a.cache_hits == b.cache_hits == 0  # sampled rows are never cached
    want = expected(evaluator, ids, fanouts=[2, 2, 2], seed=7)
    np.testing.assert_allclose(a.embeddings, want, atol=ATOL, rtol=RTOL)
    assert not np.allclose(other, a.embeddings)
    np.testing.assert_allclose(
        unseeded, expected(evaluator, ids, fanouts=[2, 2, 2], seed=0), atol=ATOL, rtol=RTOL
    )
    np.testing.assert_allclose(all_neighbours, exact, atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------- models, health


def test_list_and_get_model(served) -> None:
    with served.client() as client:
        models = client.list_models()
        info = client.get_model(MODEL)
        with pytest.raises(NotFoundError, match="'nope'"):
            client.get_model("nope")
        with pytest.raises(NotFoundError, match="version '9'"):
            client.get_model(MODEL, version=9)
    assert models == [info]
    assert (info.name, info.version, info.dim, info.num_layers) == (MODEL, "1", 5, 3)
    assert (info.graph_num_nodes, info.graph_num_edges) == (300, 1500)
    assert info.ready and info.dtype == "float32"
    assert [(b.layer, b.kind, b.in_dim, b.out_dim) for b in info.blocks] == [
        (1, "SAGEConv", 8, 16),
        (2, "SAGEConv", 16, 16),
        (3, "SAGEConv", 16, 5),
    ]


def test_health_per_model_and_reflection(served) -> None:
    with served.client() as client:
        assert client.health() and client.health(MODEL)
        assert not client.health("nope")
    with grpc.insecure_channel(served.target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        status = check(health_pb2.HealthCheckRequest(service="hopserve.v1.EmbeddingService"))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answer = next(
            stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
    names = {s.name for s in answer.list_services_response.service}
    assert {"hopserve.v1.EmbeddingService", "grpc.health.v1.Health"} <= names
    assert served.sample("hopserve_model_ready", model=MODEL, version="1") == 1
    worker = _worker_name(served)
    assert served.sample("hopserve_worker_up", worker=worker) == 1
    memory = {"worker": worker, "device": "cpu", "kind": "used"}
    assert served.sample("hopserve_worker_device_memory_bytes", **memory) > 0


def _worker_name(served) -> str:
    return served.service._workers.dispatchers[0].clients[0].name


# ----------------------------------------------------------------------------- bad input


BAD_REQUESTS: list[tuple[str, Callable[[np.ndarray], pb.GetEmbeddingsRequest], Any, list[str]]] = [
    ("unknown model", lambda ids: request(ids[:2], model="nope"),
     grpc.StatusCode.NOT_FOUND, ["'nope'"]),
    ("unknown version", lambda ids: pb.GetEmbeddingsRequest(
        model=MODEL, model_version="7", node_ids=[int(ids[0])]),
     grpc.StatusCode.NOT_FOUND, ["version '7'"]),
    ("empty node set", lambda ids: request([]),
     grpc.StatusCode.INVALID_ARGUMENT, ["empty"]),
    ("too many nodes", lambda ids: request(np.resize(ids, 100_001)),
     grpc.StatusCode.INVALID_ARGUMENT, ["100001", "100000"]),
    ("unknown ids", lambda ids: request([ids[0], 5, 6, 5]),
     grpc.StatusCode.INVALID_ARGUMENT, ["3 of 4", ": 5, 6"]),
    ("many unknown ids", lambda ids: request(list(range(1, 13))),
     grpc.StatusCode.INVALID_ARGUMENT, ["12 of 12", "1, 2, 3", "10, ... (2 more)"]),
    ("fanouts count", lambda ids: request(ids[:1], fanouts=[2, 2]),
     grpc.StatusCode.INVALID_ARGUMENT, ["[2, 2]", "3 layers"]),
    ("fanout below -1", lambda ids: request(ids[:1], fanouts=[2, -2, 2]),
     grpc.StatusCode.INVALID_ARGUMENT, ["fanouts[1]", "-2"]),
    ("fanout zero", lambda ids: request(ids[:1], fanouts=[0, 2, 2]),
     grpc.StatusCode.INVALID_ARGUMENT, ["fanouts[0]", "is 0"]),
    ("cache policy", lambda ids: request(ids[:1], cache_policy=9),
     grpc.StatusCode.INVALID_ARGUMENT, ["cache_policy 9"]),
]  # fmt: skip


@pytest.mark.parametrize("method", ["GetEmbeddings", "StreamEmbeddings"])
@pytest.mark.parametrize(
    ("make", "code", "needles"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_input_gets_the_right_status_naming_the_value(
    served, all_ids, method, make, code, needles
) -> None:
    err = raw_error(served.target, make(all_ids), method)
    assert err.code() == code, err.details()
    for needle in needles:
        assert needle in err.details()
    outcome = code.name.lower()
    labels = {"method": method, "outcome": outcome}
    model = (
        MODEL if code is not grpc.StatusCode.NOT_FOUND or "version" in err.details() else "_unknown"
    )
    assert served.sample("hopserve_requests_total", model=model, **labels) >= 1


def test_sdk_surfaces_server_validation_errors(served, all_ids) -> None:
    with served.client() as client:
        with pytest.raises(NotFoundError, match="'nope'"):
            client.get_embeddings("nope", all_ids[:2])
        with pytest.raises(InvalidArgumentError, match="99999999"):
            client.get_embeddings(MODEL, [int(all_ids[0]), 99_999_999])
        with pytest.raises(InvalidArgumentError, match="3 layers"):
            client.get_embeddings(MODEL, all_ids[:2], fanouts=[2])
        assert client.get_embeddings(MODEL, all_ids[:2]).shape == (2, 5)  # still serving


# ----------------------------------------------------------------------------- limits


@pytest.fixture(scope="module")
def tight(make_config, launch):
    """A server that makes queueing visible: 300 ms batching window, queue of 1,
    100 ms default deadline, no cache, exact embeddings only."""
    server = launch(
        make_config(
            cache={"backend": "none"},
            model={"fanouts_allowed": False},
            max_wait_ms=300,
            max_queue=1,
            default_deadline_s=0.1,
        )
    )
    yield server
    server.stop()


def test_default_deadline_expires_in_the_queue_and_the_batch_is_not_run(tight, all_ids) -> None:
    before = tight.sample("hopserve_batch_requests_count", model=MODEL)
    err = raw_error(tight.target, request(all_ids[:3]), timeout=None)  # no client deadline
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
    time.sleep(0.4)  # past the batching window: the batch would have run by now
    assert tight.sample("hopserve_batch_requests_count", model=MODEL) == before
    assert tight.sample("hopserve_queue_depth", model=MODEL) == 0
    labels = {"method": "GetEmbeddings", "model": MODEL, "outcome": "deadline_exceeded"}
    assert tight.sample("hopserve_requests_total", **labels) >= 1


def test_client_deadline_is_honoured(tight, all_ids) -> None:
    with tight.client(max_retries=0) as client:
        with pytest.raises(DeadlineExceededError):
            client.get_embeddings(MODEL, all_ids[:3], timeout=0.05)
        assert client.get_embeddings(MODEL, all_ids[:3], timeout=5).shape == (3, 5)


def test_queue_full_is_resource_exhausted(tight, all_ids) -> None:
    first: dict[str, Any] = {}

    def slow() -> None:
        first["rows"] = raw(tight.target, request(all_ids[:2]), timeout=5)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.1)  # the first request now waits out the 300 ms window
    err = raw_error(tight.target, request(all_ids[2:4]), timeout=5)
    thread.join(10)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue is full" in err.details()
    assert first["rows"].num_nodes == 2


def test_cancelled_request_leaves_and_its_batch_is_not_run(tight, all_ids) -> None:
    before = tight.sample("hopserve_batch_requests_count", model=MODEL)
    with grpc.insecure_channel(tight.target) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        future = stub.GetEmbeddings.future(request(all_ids[:3]), timeout=5)
        time.sleep(0.1)
        future.cancel()
    time.sleep(0.4)
    assert tight.sample("hopserve_batch_requests_count", model=MODEL) == before
    assert tight.sample("hopserve_queue_depth", model=MODEL) == 0


def test_sampling_refused_when_the_model_is_exact_only(tight, all_ids) -> None:
    err = raw_error(tight.target, request(all_ids[:1], fanouts=[2, 2, 2]), timeout=5)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exact embeddings only" in err.details()


def test_a_long_running_server_keeps_serving(make_config, start_server, all_ids) -> None:
    server = start_server(make_config(cache={"backend": "none"}, max_wait_ms=0))
    with server.client(max_retries=0) as client:
        for k in range(80):  # one job each
            assert client.get_embeddings(MODEL, all_ids[[k, k + 1]]).shape == (2, 5)


def test_graceful_stop_finishes_in_flight_requests(make_config, start_server, all_ids) -> None:
    server = start_server(make_config(cache={"backend": "none"}, max_wait_ms=300))
    answers: dict[str, Any] = {}

    def in_flight() -> None:
        answers["rows"] = raw(server.target, request(all_ids[:4]), timeout=5)

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.1)  # queued in the batcher's 300 ms window
    server.stop(grace=3)
    thread.join(10)
    assert answers["rows"].num_nodes == 4
    err = raw_error(server.target, request(all_ids[:1]), timeout=2)
    assert err.code() == grpc.StatusCode.UNAVAILABLE


# ----------------------------------------------------------------------------- failures


def test_redis_outage_never_fails_requests_and_the_cache_recovers(
    make_config, start_server, redis_outage, evaluator, all_ids
) -> None:
    server = start_server(make_config(cache={"redis_url": redis_outage.url}))
    ids = all_ids[[10, 11, 12, 10]]
    want = expected(evaluator, ids)
    with server.client() as client:
        client.get_embeddings(MODEL, ids)
        server.drain()
        assert client.get_embeddings_with_info(MODEL, ids).cache_hits == 4
        errors_before = server.sample("hopserve_cache_errors_total", **REDIS_LABELS)

        redis_outage.stop()  # SIGKILL
        for k in range(3):
            more = np.concatenate([ids, all_ids[[20 + k]]])
            got = client.get_embeddings_with_info(MODEL, more)
            np.testing.assert_allclose(
                got.embeddings, expected(evaluator, more), atol=ATOL, rtol=RTOL
            )
            assert got.cache_hits == 0
        server.drain()
        assert server.sample("hopserve_cache_errors_total", **REDIS_LABELS) > errors_before
        assert server.sample("hopserve_cache_up", backend="redis") == 0

        redis_outage.start()  # same port, empty
        deadline = time.monotonic() + 10
        hits = 0
        while hits < len(ids) and time.monotonic() < deadline:
            got = client.get_embeddings_with_info(MODEL, ids)
            np.testing.assert_allclose(got.embeddings, want, atol=ATOL, rtol=RTOL)
            hits = got.cache_hits
            server.drain()
            time.sleep(0.1)
    assert hits == len(ids), "the cache did not recover after Redis came back"
    assert server.sample("hopserve_cache_up", backend="redis") == 1


def test_model_that_fails_to_load_is_unavailable_others_serve(
    make_config, start_server, all_ids
) -> None:
    config = make_config()
    broken = config.models[0].model_copy(
        update={"name": "broken", "entrypoint": "support.models:NoSuchModel"}
    )
    config = config.model_copy(update={"models": [*config.models, broken]})
    server = start_server(config, expect_ready=False)
    with server.client(max_retries=0) as client:
        assert client.health(MODEL) and not client.health("broken") and not client.health()
        with pytest.raises(UnavailableError, match="'broken'.*NoSuchModel"):
            client.get_embeddings("broken", all_ids[:2])
        assert client.get_embeddings(MODEL, all_ids[:2]).shape == (2, 5)
        ready = {m.name: m.ready for m in client.list_models()}
    assert ready == {"broken": False, MODEL: True}
    assert server.sample("hopserve_model_ready", model="broken", version="1") == 0


def test_remote_worker_serves_the_same_embeddings(
    make_config, start_server, evaluator, all_ids
) -> None:
    from hopserve.worker.runtime import make_worker
    from hopserve.worker.service import serve_worker

    config = make_config(cache={"backend": "none"})
    worker = make_worker("cpu")
    worker.load_model(config.models[0], config.engine)
    worker_server, port = serve_worker(worker, "127.0.0.1", 0)
    try:
        address = f"127.0.0.1:{port}"
        server = start_server(make_config(cache={"backend": "none"}, workers=[address]))
        ids = pick(all_ids, 5, 30)
        with server.client(max_retries=0) as client:
            exact = client.get_embeddings(MODEL, ids)
            sampled = client.get_embeddings(MODEL, ids, fanouts=[3, 2, 2], seed=1)
            info = client.get_model(MODEL)
            np.testing.assert_allclose(exact, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
            want = expected(evaluator, ids, fanouts=[3, 2, 2], seed=1)
            np.testing.assert_allclose(sampled, want, atol=ATOL, rtol=RTOL)
            assert (info.ready, info.dim, info.num_layers) == (True, 5, 3)
            assert server.sample("hopserve_worker_up", worker=address) == 1

            worker_server.stop(0).wait(5)  # the only worker goes away
            with pytest.raises(UnavailableError, match="no worker"):
                client.get_embeddings(MODEL, ids)
        assert server.sample("hopserve_worker_up", worker=address) == 0
    finally:
        worker_server.stop(0)
        worker.close()


# ----------------------------------------------------------------------------- CLI


def test_hopserve_serve_cli_serves_and_stops_on_sigterm(
    make_config, tmp_path: Path, all_ids
) -> None:
    config = make_config(cache={"backend": "memory"})
    path = tmp_path / "hopserve.yaml"
    proc = start_serve(config, path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with EmbeddingClient(f"127.0.0.1:{config.server.port}", timeout=60) as client:
            client.wait_until_ready(60, model=MODEL)
            assert client.get_embeddings(MODEL, all_ids[:3]).shape == (3, 5)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = output.decode()
    assert proc.returncode == 0, text
    assert f"127.0.0.1:{config.server.port}" in text
    assert f"127.0.0.1:{config.server.metrics_port}/metrics" in text
    assert "shutting down" in text


def test_a_stalled_model_turns_not_serving_and_recovers(
    make_config, start_server, evaluator, all_ids
) -> None:
    """A model whose batches stop finishing while requests wait (here: its worker is
    stuck behind a held model lock) must show it: health NOT_SERVING for the model and
    the process, hopserve_model_stalled 1; both recover once a batch finishes."""
    server = start_server(make_config(cache={"backend": "none"}, stall_timeout_s=0.4))
    worker = server.service._workers.local["cpu"]
    lock = worker.model(MODEL, "1").lock

    def health(service: str) -> int:
        with grpc.insecure_channel(server.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

    serving = health_pb2.HealthCheckResponse.SERVING
    assert health(MODEL) == serving and server.sample("hopserve_model_stalled", model=MODEL) == 0
    answer: dict[str, Any] = {}
    lock.acquire()  # the worker hangs
    try:
        thread = threading.Thread(
            target=lambda: answer.setdefault("rows", raw(server.target, request(all_ids[:3])))
        )
        thread.start()
        deadline = time.monotonic() + 10
        while health(MODEL) == serving and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health(MODEL) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health("") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert server.sample("hopserve_model_stalled", model=MODEL) == 1
    finally:
        lock.release()  # the worker answers again
    thread.join(10)
    np.testing.assert_allclose(
        decode_embeddings(answer["rows"].embeddings, 3, 5), expected(evaluator, all_ids[:3]),
        atol=ATOL, rtol=RTOL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while health(MODEL) != serving and time.monotonic() < deadline:
        time.sleep(0.05)
    assert health(MODEL) == serving and health("") == serving
    assert server.sample("hopserve_model_stalled", model=MODEL) == 0
