"""A real ``prometheus`` on loopback, scraping a live front-end with the deployed config.

:func:`prometheus_config` is ``deploy/prometheus/prometheus.yml`` (same job names, labels
and metrics path, the committed ``alerts.yml``) pointed at a local target;
:class:`PrometheusProcess` runs it with a throw-away TSDB and wraps the HTTP API;
:func:`samples` and :func:`has_number` read query answers. Used by :mod:`livestack`.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from hopserve.testing import free_port

DEPLOY = Path(__file__).resolve().parent
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS_YML = DEPLOY / "prometheus" / "alerts.yml"
FRONTEND_JOB = "hopserve-frontend"
"""``job_name`` of the front-end in ``deploy/prometheus/prometheus.yml``."""


def prometheus_binary() -> str | None:
    """Path of the ``prometheus`` binary (Debian: ``/usr/bin/prometheus``), or None."""
    return shutil.which("prometheus")


def promtool_binary() -> str | None:
    """Path of ``promtool`` (shipped with Debian's ``prometheus`` package), or None."""
    return shutil.which("promtool")


def prometheus_config(frontend_target: str, *, interval: str = "1s") -> dict[str, Any]:
    """``deploy/prometheus/prometheus.yml`` pointed at a live front-end.

    Keeps the deployed job names, labels and metrics path; replaces the intervals, the
    front-end's targets and the rule file path (absolute, the committed alerts.yml).
    Jobs other than the front-end are dropped (nothing else runs here).
    """
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": interval,
        "evaluation_interval": interval,
    }
    config["rule_files"] = [str(ALERTS_YML)]
    config.pop("alerting", None)
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == FRONTEND_JOB]
    if len(jobs) != 1:
        raise ValueError(f"{PROMETHEUS_YML}: expected one job named {FRONTEND_JOB!r}")
    job = dict(jobs[0])
    job["scrape_interval"] = interval
    job["scrape_timeout"] = interval
    job["static_configs"] = [
        {**job["static_configs"][0], "targets": [frontend_target]}  # keep static labels
    ]
    config["scrape_configs"] = [job]
    return config


class PrometheusProcess:
    """``prometheus`` on a free loopback port with a throw-away TSDB; HTTP API helpers."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        binary = prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus is not installed (Debian: apt-get install prometheus)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            [binary, f"--config.file={self.config_path}",
             f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1d", "--log.level=warn"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()}")
            with contextlib.suppress(OSError):
                if self._get("/-/ready", raw=True):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready after 60 s: {self.log()}")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def _get(self, path: str, params: dict[str, Any] | None = None, raw: bool = False) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as resp:
                body = resp.read()
        except urllib.error.HTTPError as err:  # 400/422: a bad query; the body says why
            body = err.read()
            if raw:
                raise
        return body if raw else json.loads(body)

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """``/api/v1/query``: the whole JSON answer (``status``, ``data`` or ``error``)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._get("/api/v1/query", params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        """``/api/v1/query_range``: the whole JSON answer."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        return self._get("/api/v1/query_range", params)

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule (``/api/v1/rules``), with its ``health`` and ``lastError``."""
        groups = self._get("/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/targets")["data"]["activeTargets"]

    def stop(self) -> None:
        terminate(self._proc)
        self._log.close()


def samples(answer: dict[str, Any]) -> list[float]:
    """Every numeric value in a query answer (vector, matrix or scalar), NaN included."""
    data = answer.get("data", {})
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return [float(result[1])]
    if kind == "vector":
        return [float(s["value"][1]) for s in result]
    if kind == "matrix":
        return [float(v[1]) for s in result for v in s["values"]]
    return []


def has_number(answer: dict[str, Any]) -> bool:
    """Whether an answer holds at least one sample that is a finite number."""
    return any(math.isfinite(v) for v in samples(answer))


def terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
