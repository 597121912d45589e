"""Fixtures of the deploy tests: the committed deploy files, parsed, and a live stack.

- ``live`` (module): :class:`livestack.LiveStack` (hopserve front-end + Redis or the
  in-process cache + a real Prometheus scraping it every second, alerts.yml loaded), with
  client load running in the background and at least 5 scrapes of traffic recorded.
  Skipped only when ``/usr/bin/prometheus`` is missing (``.ci/run`` installs it).
- ``promtool``: path of promtool (skip when missing, same package).

The scripts under ``deploy/`` are imported by module name (``livestack``,
``build_dashboards``), like ``promql_lint`` here: their folders are put on ``sys.path``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
for folder in (DEPLOY, DEPLOY / "grafana", Path(__file__).resolve().parent):
    if str(folder) not in sys.path:
        sys.path.append(str(folder))

import live_prometheus  # noqa: E402
import livestack  # noqa: E402

MISSING_PROMETHEUS = (
    "prometheus is not installed (Debian package 'prometheus', /usr/bin/prometheus; "
    ".ci/run installs it): the live dashboard/alert checks need a real Prometheus"
)


@pytest.fixture(scope="session")
def promtool() -> str:
    path = live_prometheus.promtool_binary()
    if path is None:
        pytest.skip(MISSING_PROMETHEUS.replace("prometheus is", "promtool is"))
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[livestack.LiveStack]:
    if live_prometheus.prometheus_binary() is None:
        pytest.skip(MISSING_PROMETHEUS)
    stack = livestack.LiveStack(tmp_path_factory.mktemp("live"))
    try:
        stack.load.start()
        stack.load.wait_for(300)  # a few hundred requests before the first checks
        stack.wait_for_scrapes(5)
        yield stack
    finally:
        stack.close()
