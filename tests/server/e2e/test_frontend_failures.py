"""End to end, under limits and failures: deadlines, queue limits, cancellation, Redis
and worker failures, the CLI and a stalled model.

Real components throughout (see ``conftest.py``); helpers in ``support/e2e.py``.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.e2e import ATOL, MODEL, REDIS_LABELS, RTOL, expected, pick, raw, raw_error, request
from support.processes import start_serve

from hopserve.client import (
    DeadlineExceededError,
    EmbeddingClient,
    UnavailableError,
)
from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import embedding_pb2_grpc

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
