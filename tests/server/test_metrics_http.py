"""The metrics port over real HTTP: /metrics, /healthz, 404 elsewhere."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

import hopserve
from hopserve.server.metrics import Metrics
from hopserve.server.metrics_http import start_metrics_server


@pytest.fixture
def served():
    metrics = Metrics()
    metrics.observe_request("GetEmbeddings", "cora", "ok", 0.003)
    state = {"healthy": True}
    server, port = start_metrics_server(
        0, metrics.registry, addr="127.0.0.1", healthy=lambda: state["healthy"]
    )
    yield f"http://127.0.0.1:{port}", state
    server.shutdown()
    server.server_close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_metrics_are_exposed(served) -> None:
    base, _ = served
    status, body = _get(f"{base}/metrics")
    assert status == 200
    assert "hopserve_request_duration_seconds_bucket" in body
    assert 'hopserve_requests_total{method="GetEmbeddings",model="cora",outcome="ok"} 1.0' in body
    assert f'hopserve_build_info{{version="{hopserve.__version__}"}} 1.0' in body


def test_healthz_follows_the_service(served) -> None:
    base, state = served
    assert _get(f"{base}/healthz") == (200, "SERVING\n")
    state["healthy"] = False
    assert _get(f"{base}/healthz") == (503, "NOT_SERVING\n")


@pytest.mark.parametrize("path", ["/", "/favicon.ico", "/metrics/x", "/debug", "/../etc/passwd"])
def test_everything_else_is_not_found(served, path: str) -> None:
    base, _ = served
    status, body = _get(f"{base}{path}")
    assert status == 404
    assert "hopserve_" not in body
