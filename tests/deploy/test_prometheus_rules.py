"""Prometheus configuration and alerting rules: promtool, unit tests, contract.

``promtool`` ships with Debian's ``prometheus`` package (``.ci/run`` installs it). The
live test evaluates every rule against real data; these checks need no server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_lint
import pytest
import yaml
from live_prometheus import DEPLOY

from hopserve.config import load_config

PROMETHEUS = DEPLOY / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")
CONFIGS = (DEPLOY / "hopserve.yaml", DEPLOY / "k8s" / "hopserve.yaml")


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def promtool_run(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_check_rules(promtool: str) -> None:
    result = promtool_run(promtool, "check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_check_config(promtool: str) -> None:
    result = promtool_run(promtool, "check", "config", PROMETHEUS / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout  # alerts.yml, next to it


def test_promtool_check_kubernetes_config(promtool: str, tmp_path: Path) -> None:
    """prometheus-k8s.yml; Debian's build has no Kubernetes discovery compiled in, so
    there the same file with a static target instead checks everything else (relabel
    rules, rule file)."""
    path = PROMETHEUS / "prometheus-k8s.yml"
    result = promtool_run(promtool, "check", "config", path)
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        config = yaml.safe_load(path.read_text())
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
            job["static_configs"] = [{"targets": ["10.0.0.1:9090"]}]
        shutil.copy(ALERTS, tmp_path / "alerts.yml")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        result = promtool_run(promtool, "check", "config", tmp_path / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests(promtool: str) -> None:
    """tests/deploy/alerts_test.yml: each alert fires on synthetic series, and not early."""
    result = promtool_run(promtool, "test", "rules", UNIT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_unit_test() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    firing = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    missing = sorted({rule["alert"] for rule in rules()} - firing)
    assert not missing, f"alerts without a firing case in alerts_test.yml: {missing}"


def test_rules_follow_the_metric_contract() -> None:
    problems = []
    for rule in rules():
        problems += promql_lint.check(rule["expr"], rule["alert"], require_model_filter=False)
    assert not problems, "\n".join(map(str, problems))


def test_rule_metadata() -> None:
    names = [rule["alert"] for rule in rules()]
    assert len(set(names)) == len(names), "duplicate alert names"
    for rule in rules():
        name = rule["alert"]
        assert name.startswith("Hopserve"), name
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: needs a for: duration"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"].strip(), name
        assert len(rule["annotations"]["description"]) > 40, name


def test_error_ratio_outcomes_match_what_the_frontend_emits() -> None:
    """Client-caused outcomes excluded from the server-side error ratio are real outcome
    labels (server/errors.py: ok or the lower-case gRPC status name)."""
    from hopserve.server.errors import outcome_label

    (rule,) = [r for r in rules() if r["alert"] == "HopserveHighErrorRatio"]
    (excluded,) = re.findall(r'outcome!~"([^"]+)"', rule["expr"])
    emitted = {outcome_label(None)} | {outcome_label(code) for code in promql_lint.grpc.StatusCode}
    assert set(excluded.split("|")) <= emitted
    assert {"ok", "invalid_argument", "not_found", "cancelled"} == set(excluded.split("|"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_queue_threshold_is_eighty_percent_of_max_queue(config: Path) -> None:
    max_queue = load_config(config, env={}).server.max_queue
    (rule,) = [r for r in rules() if r["alert"] == "HopserveQueueSaturated"]
    assert re.search(rf"> 0\.8 \* {max_queue}\b", rule["expr"]), (rule["expr"], max_queue)
    assert f"({max_queue})" in rule["annotations"]["description"]


def test_job_names_exist_in_the_scrape_configs() -> None:
    jobs = {
        path.name: {job["job_name"] for job in yaml.safe_load(path.read_text())["scrape_configs"]}
        for path in PROMETHEUS.glob("prometheus*.yml")
    }
    assert len(jobs) == 2
    for rule in rules():
        for job in re.findall(r'job="([^"]+)"', rule["expr"]):
            for file, names in jobs.items():
                assert job in names, f"{rule['alert']}: job {job!r} not in {file}"


def test_scrape_target_is_the_frontend_metrics_port() -> None:
    config = load_config(DEPLOY / "hopserve.yaml", env={})
    prometheus = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "hopserve-frontend"]
    (target,) = job["static_configs"][0]["targets"]
    assert target == f"hopserve:{config.server.metrics_port}"  # compose service "hopserve"
    assert prometheus["rule_files"] == ["alerts.yml"]
