"""End to end: client SDK → gRPC → front-end → cache / batcher / planner → engine.

Real components throughout (see ``conftest.py``). Expected embeddings come from running
the engine directly (``LayerwiseEvaluator.evaluate``) on the same graph and weights.
Requests the SDK would refuse before sending go through the raw gRPC stub.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.e2e import ATOL, MODEL, REDIS_LABELS, RTOL, expected, pick, raw, raw_error, request

from hopserve import GraphStore
from hopserve.client import (
    InvalidArgumentError,
    NotFoundError,
)
from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb

# ----------------------------------------------------------------------------- exact


def test_served_embeddings_equal_the_engine(served, evaluator, all_ids) -> None:
    ids = pick(all_ids, 0, 40)  # random order, with duplicates
    with served.client() as client:
        result = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
    np.testing.assert_allclose(result.embeddings, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
    assert result.embeddings.shape == (40, 5)
    assert result.model == MODEL and result.model_version == "1"
    content = GraphStore.open(served.service.models.get(MODEL).topology.path).version
    assert result.graph_version == content and result.graph_seq == 0
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


def test_concurrent_write_backs_go_out_together(served, all_ids) -> None:
    """Write-behind with group commit: rows computed for 8 concurrent requests reach the
    cache in at most one write per batch (not one per request), every one of them."""
    labels = {"model": MODEL, "stage": "write_back"}
    before = served.sample("hopserve_stage_duration_seconds_count", **labels) or 0.0
    batches_before = served.sample("hopserve_batch_requests_count", model=MODEL) or 0.0
    barrier = threading.Barrier(8)
    requests = {k: all_ids[[200 + k, 240 + k, 280 + k]] for k in range(8)}

    def one(k: int) -> None:
        with served.client() as client:
            barrier.wait()
            client.get_embeddings(MODEL, requests[k], cache_policy="refresh")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    served.drain()
    writes = served.sample("hopserve_stage_duration_seconds_count", **labels) - before
    batches = served.sample("hopserve_batch_requests_count", model=MODEL) - batches_before
    assert 1 <= writes <= batches < 8  # one write per batch at most, not one per request
    with served.client() as client:
        again = client.get_embeddings_with_info(MODEL, np.concatenate(list(requests.values())))
    assert again.cache_hits == 24


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
