"""Retry policy and deadlines, for both clients, over real loopback gRPC."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from hopserve.client import (
    DeadlineExceededError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)

MODEL = "sage"  # the model the fake server (conftest.py) serves
#: Scheduling slack on a busy 2-core CI machine.
SLACK = 1.0


def test_retries_until_a_late_server_comes_up(make_client, start_fake, free_port) -> None:
    """The call starts first; the server binds the port 0.5 s later; the call succeeds."""
    started = []
    timer = threading.Timer(0.5, lambda: started.append(start_fake(free_port)))
    client = make_client(
        f"127.0.0.1:{free_port}", max_retries=30, backoff_base=0.1, backoff_max=0.4, timeout=20
    )
    t0 = time.monotonic()
    timer.start()
    try:
        emb = client.get_embeddings(MODEL, [4, 2])
        elapsed = time.monotonic() - t0
    finally:
        timer.join()
    (server,) = started
    np.testing.assert_array_equal(emb, server.service.rows([4, 2]))
    assert elapsed >= 0.45  # it really waited for the server
    assert len(server.service.calls("GetEmbeddings")) == 1


def test_unavailable_server_gives_up_after_max_retries(make_client, free_port) -> None:
    client = make_client(f"127.0.0.1:{free_port}", max_retries=2, backoff_base=0.01)
    with pytest.raises(UnavailableError) as exc:
        client.get_embeddings(MODEL, [1])
    assert exc.value.code is grpc.StatusCode.UNAVAILABLE and exc.value.details


def test_retries_on_resource_exhausted(fake, make_client) -> None:
    fake.service.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, times=2)
    client = make_client(fake.target, max_retries=3, backoff_base=0.01)
    np.testing.assert_array_equal(client.get_embeddings(MODEL, [3]), fake.service.rows([3]))
    assert len(fake.service.calls("GetEmbeddings")) == 3


def test_retries_a_call_the_server_cancelled(fake, make_client) -> None:
    """A server shutting down cancels calls it received but never started; the client
    never cancels a call it still waits for, so CANCELLED is retried like UNAVAILABLE."""
    fake.service.fail(grpc.StatusCode.CANCELLED, times=2)
    client = make_client(fake.target, backoff_base=0.01)
    assert client.get_embeddings(MODEL, [1, 2]).shape == (2, fake.service.dim)
    assert len(fake.service.calls("GetEmbeddings")) == 3


def _calls_until_raised(fake, make_client, code, details, error, max_retries, node) -> int:
    """The server fails the next 5 calls with ``code``: the client raises ``error`` (naming
    ``details``); returns how many GetEmbeddings calls the server received."""
    fake.service.fail(code, times=5, details=details)
    client = make_client(fake.target, max_retries=max_retries, backoff_base=0.01)
    with pytest.raises(error, match=details):
        client.get_embeddings(MODEL, [node])
    return len(fake.service.calls("GetEmbeddings"))


def test_resource_exhausted_beyond_max_retries_raises(fake, make_client) -> None:
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    calls = _calls_until_raised(fake, make_client, code, "queue full", ResourceExhaustedError, 1, 3)
    assert calls == 2


def test_no_retry_on_invalid_argument(fake, make_client) -> None:
    code = grpc.StatusCode.INVALID_ARGUMENT
    assert _calls_until_raised(fake, make_client, code, "bad id 7", InvalidArgumentError, 4, 7) == 1


def test_retries_apply_to_metadata_calls(fake, make_client) -> None:
    fake.service.fail(grpc.StatusCode.UNAVAILABLE, times=2, method="ListModels")
    client = make_client(fake.target, backoff_base=0.01)
    assert client.list_models()[0].name == MODEL
    assert len(fake.service.calls("ListModels")) == 3


def test_deadline_on_a_slow_server(start_fake, make_client) -> None:
    fake = start_fake(delay=3.0)
    client = make_client(fake.target, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError) as exc:
        client.get_embeddings(MODEL, [1])
    assert time.monotonic() - t0 < 0.3 + SLACK
    assert isinstance(exc.value, TimeoutError)
    assert len(fake.service.calls("GetEmbeddings")) == 1  # DEADLINE_EXCEEDED is not retried


def test_per_call_timeout_overrides_the_default(start_fake, make_client) -> None:
    fake = start_fake(delay=0.5)
    client = make_client(fake.target, timeout=0.1)
    assert client.get_embeddings(MODEL, [1], timeout=10).shape == (1, fake.service.dim)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        client.get_embeddings(MODEL, [1])
    assert time.monotonic() - t0 < 0.1 + SLACK


def test_retries_never_outlive_the_deadline(fake, make_client) -> None:
    fake.service.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, times=10**6)
    client = make_client(fake.target, max_retries=10**6, backoff_base=0.02, backoff_max=0.1)
    t0 = time.monotonic()
    with pytest.raises((ResourceExhaustedError, DeadlineExceededError)):
        client.get_embeddings(MODEL, [1], timeout=0.6)
    assert time.monotonic() - t0 < 0.6 + SLACK
    assert len(fake.service.calls("GetEmbeddings")) > 2  # it did retry meanwhile


def test_deadline_covers_all_pieces_of_a_split_call(start_fake, make_client) -> None:
    fake = start_fake(delay=0.2)
    client = make_client(fake.target, max_nodes_per_request=1)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        client.get_embeddings(MODEL, np.arange(20), timeout=0.5)  # 20 x 0.2 s > 0.5 s
    assert time.monotonic() - t0 < 0.5 + SLACK
    assert len(fake.service.calls("GetEmbeddings")) <= 3


def test_stream_deadline(start_fake, make_client) -> None:
    fake = start_fake(delay=3.0)
    client = make_client(fake.target)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        list(client.stream_embeddings(MODEL, [1, 2], timeout=0.3))
    assert time.monotonic() - t0 < 0.3 + SLACK
