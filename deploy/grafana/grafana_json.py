"""A small typed model of Grafana dashboards and its rendering to dashboard JSON.

Dashboards are data (:class:`Dashboard` of :class:`Row` of :class:`Panel` of
:class:`Query`), rendered to Grafana's dashboard JSON (schema 39, Grafana 10/11) with a
``datasource`` and a ``model`` variable; :mod:`build_dashboards` says what is on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

PanelKind = Literal["timeseries", "stat"]


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A timeseries or stat panel; ``width`` in grid units (24 per row)."""

    title: str
    queries: tuple[Query, ...]
    description: str = ""
    unit: str = "short"
    kind: PanelKind = "timeseries"
    width: int = 8
    height: int = 8
    stack: bool = False
    min: float | None = 0
    max: float | None = None
    thresholds: tuple[tuple[float, str], ...] = ()
    """``(value, color)`` steps above the base (green); drawn as lines on timeseries."""
    decimals: int | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = ("hopserve",)
    extra_tags: tuple[str, ...] = field(default=())


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in panel.thresholds]
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "color": {"mode": "palette-classic" if panel.kind == "timeseries" else "thresholds"},
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 25 if panel.stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if panel.stack else "none"},
            "thresholdsStyle": {"mode": "line" if panel.thresholds else "off"},
        }
        options: dict[str, Any] = {
            "legend": {"calcs": [], "displayMode": "list", "placement": "bottom",
                       "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }  # fmt: skip
    else:
        options = {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        }
    targets = [
        {
            "datasource": DATASOURCE,
            "expr": query.expr,
            "legendFormat": query.legend or "__auto",
            "range": True,
            "refId": chr(ord("A") + i),
        }
        for i, query in enumerate(panel.queries)
    ]
    return {
        "datasource": DATASOURCE,
        "description": panel.description,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "id": panel_id,
        "options": options,
        "targets": targets,
        "title": panel.title,
        "type": panel.kind,
    }


def _layout(dashboard: Dashboard) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row in dashboard.rows:
        panels.append({
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "id": next_id,
            "panels": [],
            "title": row.title,
            "type": "row",
        })  # fmt: skip
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return panels


def _templating() -> dict[str, Any]:
    return {
        "list": [
            {
                "current": {},
                "hide": 0,
                "includeAll": False,
                "label": "Data source",
                "multi": False,
                "name": "datasource",
                "options": [],
                "query": "prometheus",
                "refresh": 1,
                "regex": "",
                "type": "datasource",
            },
            {
                "allValue": ".+",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "datasource": DATASOURCE,
                "definition": "label_values(hopserve_model_ready, model)",
                "hide": 0,
                "includeAll": True,
                "label": "Model",
                "multi": True,
                "name": "model",
                "options": [],
                "query": "label_values(hopserve_model_ready, model)",
                "refresh": 2,
                "regex": "",
                "sort": 1,
                "type": "query",
            },
        ]
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana JSON (what the provisioning provider loads)."""
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": dashboard.description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": True,
                "keepTime": True,
                "tags": ["hopserve"],
                "title": "hopserve",
                "type": "dashboards",
            }
        ],
        "panels": _layout(dashboard),
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": list(dashboard.tags),
        "templating": _templating(),
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": dashboard.title,
        "uid": dashboard.uid,
        "version": 1,
    }


def dump(dashboard: Dashboard) -> str:
    """Stable text of the JSON file (sorted keys, 2-space indent, final newline)."""
    return json.dumps(render(dashboard), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
