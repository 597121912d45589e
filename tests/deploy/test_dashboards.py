"""The Grafana dashboards and provisioning files: generated, consistent, on contract.

The live test (``test_live_prometheus.py``) evaluates every panel query in a real
Prometheus; these checks need no Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import build_dashboards
import promql_lint
import pytest
import yaml
from live_prometheus import DEPLOY

DASHBOARD_FILES = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
PROVISIONING = DEPLOY / "grafana" / "provisioning"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every non-row panel."""
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_committed_json_is_what_the_builder_writes() -> None:
    generated = build_dashboards.generated()
    assert sorted(generated) == DASHBOARD_FILES, "a dashboard file is missing or extra"
    for path, text in generated.items():
        assert path.read_text() == text, (
            f"{path.name} is stale: run python deploy/grafana/build_dashboards.py"
        )
    assert build_dashboards.main(["--check"]) == 0


def test_the_three_dashboards_exist() -> None:
    assert {p.stem for p in DASHBOARD_FILES} == {"overview", "engine", "cache"}
    uids = [load(p)["uid"] for p in DASHBOARD_FILES]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panel_queries_follow_the_metric_contract(path: Path) -> None:
    problems = []
    for panel in panels(load(path)):
        for target in panel["targets"]:
            where = f"{path.stem} / {panel['title']} / {target['refId']}"
            problems += promql_lint.check(target["expr"], where, require_model_filter=True)
    assert not problems, "\n".join(map(str, problems))


def test_every_metric_with_a_model_label_is_filtered_somewhere() -> None:
    """The model variable filters every panel; and the dashboards cover the contract."""
    exprs = " ".join(
        t["expr"] for p in DASHBOARD_FILES for panel in panels(load(p)) for t in panel["targets"]
    )
    unused = [
        spec.name for spec in promql_lint.METRICS
        if spec.name not in exprs and spec.type != "info"
        and spec.name not in ("hopserve_model_ready",)  # the model variable's source
    ]  # fmt: skip
    assert not unused, f"metrics on no dashboard: {unused}"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_structure(path: Path) -> None:
    dashboard = load(path)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["query"] == "label_values(hopserve_model_ready, model)"
    assert model["includeAll"] and model["multi"]
    assert "hopserve_model_ready" in promql_lint.SERIES
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}  # fmt: skip
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat")
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids)
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_queue_depth_threshold_is_max_queue() -> None:
    from hopserve.config import load_config

    max_queue = load_config(DEPLOY / "hopserve.yaml", env={}).server.max_queue
    overview = load(DEPLOY / "grafana" / "dashboards" / "overview.json")
    (queue,) = [p for p in panels(overview) if p["title"] == "Queue depth"]
    steps = queue["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == max_queue


def test_provisioning_files() -> None:
    (datasource_file,) = (PROVISIONING / "datasources").glob("*.yaml")
    (datasource,) = yaml.safe_load(datasource_file.read_text())["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["isDefault"] is True
    assert datasource["url"] == "http://prometheus:9090"  # the compose service
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert datasource["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]

    (provider_file,) = (PROVISIONING / "dashboards").glob("*.yaml")
    (provider,) = yaml.safe_load(provider_file.read_text())["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert home == f"{provider['options']['path']}/overview.json"
