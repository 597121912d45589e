"""Every dashboard panel query and every alert rule, evaluated by a real Prometheus.

The ``live`` fixture (conftest.py) runs a hopserve front-end (in-process, small synthetic
graph, GraphSAGE) with Redis as cache, scripted client load (cached repeats, unknown node
IDs, an unknown model, corrupted cache rows) and ``/usr/bin/prometheus`` scraping it
every second with ``deploy/prometheus/alerts.yml`` loaded. Each panel query, with
``$model`` and ``$__rate_interval`` substituted as Grafana would, must parse and return
at least one finite sample; each rule expression must parse, and every loaded rule must
evaluate without error. A renamed metric or label therefore fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import live_prometheus
import livestack
import pytest
import yaml
from live_prometheus import DEPLOY
from render_panels import substitute

from hopserve.server.app import SERVICE_NAME

RATE_INTERVAL = "15s"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
REDIS_ONLY = "hopserve_cache_operation_duration_seconds"  # the memory cache times nothing


def panel_queries() -> list[tuple[str, str]]:
    """``(where, expr)`` of every panel target of every dashboard."""
    queries = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                where = f"{path.stem} / {panel['title']} / {target['refId']}"
                queries.append((where, target["expr"]))
    return queries


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_prometheus_scrapes_the_frontend(live: livestack.LiveStack) -> None:
    (target,) = live.prometheus.targets()
    assert target["labels"]["job"] == live_prometheus.FRONTEND_JOB
    assert target["health"] == "up", target
    assert target["scrapeUrl"] == f"http://{live.server.metrics_target}/metrics"


def test_every_panel_query_returns_data(live: livestack.LiveStack) -> None:
    at = time.time()
    failures = []
    for where, expr in panel_queries():
        query = substitute(expr, livestack.MODEL, RATE_INTERVAL)
        answer = live.prometheus.query(query, at=at)
        if answer.get("status") != "success":
            failures.append(f"{where}: {answer.get('errorType')}: {answer.get('error')}\n  {query}")
        elif not live_prometheus.has_number(answer):
            if REDIS_ONLY in expr and live.cache_backend != "redis":
                continue  # parsed; needs redis-server for data
            failures.append(f"{where}: no finite sample: {answer['data']['result']}\n  {query}")
    assert not failures, "\n".join(failures)


def test_every_alert_expression_parses_and_evaluates(live: livestack.LiveStack) -> None:
    failures = []
    for rule in alert_rules():
        answer = live.prometheus.query(rule["expr"])
        if answer.get("status") != "success":
            failures.append(f"{rule['alert']}: {answer.get('error')}")
    assert not failures, "\n".join(failures)


def test_loaded_rules_are_healthy(live: livestack.LiveStack) -> None:
    """Prometheus loaded alerts.yml (rule_files) and evaluated each rule without error."""
    expected = {rule["alert"] for rule in alert_rules()}
    deadline = time.monotonic() + 30
    while True:
        loaded = live.prometheus.rules()
        evaluated = [r for r in loaded if not r.get("lastEvaluation", "").startswith("0001")]
        if len(evaluated) == len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {r["name"] for r in loaded} == expected
    unhealthy = [(r["name"], r["health"], r.get("lastError")) for r in loaded
                 if r["health"] != "ok"]  # fmt: skip
    assert not unhealthy
    assert len(evaluated) == len(expected)


def test_model_variable_lists_the_served_model(live: livestack.LiveStack) -> None:
    """``label_values(hopserve_model_ready, model)``, the dashboards' model variable."""
    answer = live.prometheus.query("hopserve_model_ready")
    models = {s["metric"]["model"] for s in answer["data"]["result"]}
    assert models == {livestack.MODEL}


def test_error_series_exist(live: livestack.LiveStack) -> None:
    """The scripted bad requests produced the outcomes the error panels and alerts use."""
    answer = live.prometheus.query("sum by (model, outcome) (hopserve_requests_total)")
    seen = {(s["metric"]["model"], s["metric"]["outcome"]) for s in answer["data"]["result"]}
    assert {(livestack.MODEL, "ok"), (livestack.MODEL, "invalid_argument")} <= seen
    assert ("_unknown", "not_found") in seen
    if live.cache_backend == "redis":
        errors = live.prometheus.query("sum(hopserve_cache_errors_total)")
        assert live_prometheus.samples(errors) and live_prometheus.samples(errors)[0] > 0


def test_compose_healthcheck_passes_against_a_live_frontend(live: livestack.LiveStack) -> None:
    """The compose healthcheck of the front-end (GET /healthz on the metrics port) passes
    against a live front-end, and fails where nothing SERVING answers."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    test = compose["services"]["hopserve"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    code = test[3].replace("127.0.0.1:9090", live.server.metrics_target)
    assert code != test[3]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    # and it fails where no SERVING front-end answers (the gRPC port speaks no HTTP)
    bad = test[3].replace("127.0.0.1:9090", live.server.target)
    assert subprocess.run([sys.executable, "-c", bad], capture_output=True, timeout=60).returncode


def test_frontend_health_names_used_by_the_probes(live: livestack.LiveStack) -> None:
    """The k8s probes ask for "" (readiness) and the EmbeddingService name (liveness)."""
    from hopserve.client import EmbeddingClient

    with EmbeddingClient(live.server.target) as client:
        assert client.health()
    code = (
        "import grpc, sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; "
        f"r = g.HealthStub(grpc.insecure_channel('{live.server.target}')).Check("
        f"h.HealthCheckRequest(service='{SERVICE_NAME}'), timeout=3); "
        "sys.exit(r.status != h.HealthCheckResponse.SERVING)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize("name", ["overview", "engine"])
def test_render_panels_from_the_live_prometheus(
    live: livestack.LiveStack, name: str, tmp_path: Any
) -> None:
    """render_panels.py draws the dashboards from range queries (no data left out)."""
    import render_panels

    end = time.time()
    query = render_panels.http_query(live.prometheus.url)
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / f"{name}.json").read_text())
    fig = render_panels.render(dashboard, query, (live.started, end, 1.0), livestack.MODEL,
                               RATE_INTERVAL, "test")  # fmt: skip
    path = tmp_path / f"{name}.png"
    fig.savefig(path)
    assert path.stat().st_size > 20_000
