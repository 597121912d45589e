"""The timeline: binned series from the run (:func:`timeline`, kept in the JSON) and the
figure drawn from them (:func:`plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import harness
import numpy as np

from .common import LOAD, MODEL

if TYPE_CHECKING:
    from .run import Soak


def timeline(rec: dict[str, np.ndarray], soak: Soak, names: dict[int, str]) -> dict[str, Any]:
    """Binned series for the plot (seconds since the open loop started)."""
    t0 = soak.state.t0
    end = max(float(rec["end"].max()) - t0, 1.0)
    width = max(0.5, soak.plan.total_s / 150.0)
    edges = np.arange(0.0, end + width, width)
    done = rec["end"] - t0
    ok_load = (rec["code"] == 0) & (rec["source"] == LOAD)
    qps = np.histogram(done[ok_load], edges)[0] / width
    lat = (rec["end"] - rec["sched"]) * 1e3
    idx = np.digitize(done, edges) - 1
    p99 = []
    for b in range(edges.size - 1):
        sel = lat[ok_load & (idx == b)]
        p99.append(float(np.percentile(sel, 99)) if sel.size else None)
    errors = {}
    for code in np.unique(rec["code"][rec["code"] != 0]):
        m = rec["code"] == code
        errors[names.get(int(code), str(code))] = (np.histogram(done[m], edges)[0] / width).tolist()
    rss: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    if soak.rss is not None:
        cpu["host"] = {
            "t": [round(t - t0, 2) for t, _ in soak.rss.host],
            "pct": [round(v, 1) for _, v in soak.rss.host],
        }
        for name in ("front-end", "worker", "load generator"):
            ts, vals = soak.rss.series(name)
            rss[name] = {
                "t": [round(t - t0, 2) for t in ts],
                "mb": [round(v / 2**20, 1) for v in vals],
            }
            ts, pct = soak.rss.cpu_percent(name)
            cpu[name] = {"t": [round(t - t0, 2) for t in ts], "pct": [round(v, 1) for v in pct]}
    gauges: dict[str, Any] = {}
    if soak.metrics is not None:
        for label, name, selector in (
            ("in flight", "hopserve_inflight_requests", {"model": MODEL}),
            ("queue depth", "hopserve_queue_depth", {"model": MODEL}),
            ("cache up", "hopserve_cache_up", {}),
            ("worker up", "hopserve_worker_up", {}),
        ):
            keys = soak.metrics.matching(name, **selector)
            if keys:
                ts, vals = soak.metrics.series(keys[0])
                gauges[label] = {"t": [round(t - t0, 2) for t in ts], "v": vals}
    return {
        "bin_s": width,
        "t": (edges[:-1] + width / 2).round(3).tolist(),
        "qps_ok": qps.round(2).tolist(),
        "p99_ms": p99,
        "errors_per_s": errors,
        "rss": rss,
        "cpu_pct": cpu,
        "frontend_gauges": gauges,
        "phases": [(n, round(s - t0, 3), round(e - t0, 3)) for n, s, e in soak.state.phases],
    }


def _down_spans(series: dict[str, Any] | None) -> list[tuple[float, float]]:
    """``(start, width)`` intervals where a 0/1 gauge series is 0."""
    spans: list[tuple[float, float]] = []
    if not series:
        return spans
    start = None
    for t, v in zip(series["t"], series["v"], strict=True):
        if v == 0 and start is None:
            start = t
        elif v != 0 and start is not None:
            spans.append((start, t - start))
            start = None
    if start is not None:
        spans.append((start, series["t"][-1] - start))
    return spans


def plot(path: Path, s: dict[str, Any]) -> None:
    """Timeline: QPS (+ RSS), p99, errors by code (+ what the front-end saw down), front-end
    in-flight requests and queue depth (+ CPU); phases shaded, fault events marked."""
    plt = harness.pyplot()
    tl = s["timeline"]
    t = np.asarray(tl["t"])
    fig, (a, b, c, d) = plt.subplots(
        4, 1, figsize=(11, 9.5), sharex=True, gridspec_kw={"height_ratios": [3, 2, 2, 2]}
    )
    a.plot(t, tl["qps_ok"], color="#2b7bba", lw=1.2, label="QPS (ok, load generator)")
    a.axhline(s["load"]["rate_qps"], color="#2b7bba", ls=":", lw=0.8, label="offered rate")
    a.set_ylabel("requests / s")
    a.set_ylim(bottom=0)
    a2 = a.twinx()
    for name, color in (("front-end", "#6a3d9a"), ("worker", "#b2abd2")):
        series = tl["rss"].get(name)
        if series and series["t"]:
            a2.plot(series["t"], series["mb"], color=color, lw=1.0, label=f"RSS {name}")
    a2.set_ylabel("RSS (MB)")
    a2.set_ylim(bottom=0)
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = a2.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, loc="lower left", fontsize=7)

    p99 = np.asarray([np.nan if v is None else v for v in tl["p99_ms"]], dtype=float)
    b.plot(t, p99, color="#d95f02", lw=1.0)
    b.set_yscale("log")
    b.set_ylabel("p99 latency,\nok (ms)")

    palette = {
        "UNAVAILABLE": "#e31a1c",
        "CANCELLED": "#ff7f00",
        "DEADLINE_EXCEEDED": "#6a3d9a",
        "RESOURCE_EXHAUSTED": "#33a02c",
        "INTERNAL": "#000000",
    }
    for code, series in tl["errors_per_s"].items():
        c.plot(t, series, lw=1.0, label=code, color=palette.get(code))
    top = max([1.0] + [max(v) for v in tl["errors_per_s"].values() if v])
    gauges = tl.get("frontend_gauges", {})
    for row, (label, color) in enumerate((("cache up", "#1f78b4"), ("worker up", "#33a02c"))):
        spans = _down_spans(gauges.get(label))
        if spans:
            c.broken_barh(
                spans,
                (top * (1.04 + 0.07 * row), top * 0.05),
                color=color,
                label=f"front-end: {label.split()[0]} down",
            )
    if tl["errors_per_s"] or gauges:
        c.legend(loc="upper left", fontsize=7)
    c.set_ylabel("errors / s")

    for label, color in (("in flight", "#444444"), ("queue depth", "#e7298a")):
        series = gauges.get(label)
        if series:
            d.plot(series["t"], series["v"], color=color, lw=1.0, label=f"front-end {label}")
    d.set_ylabel("requests")
    d.set_ylim(bottom=0)
    d2 = d.twinx()
    for name, color in (
        ("host", "#bbbbbb"),
        ("front-end", "#6a3d9a"),
        ("worker", "#b2abd2"),
        ("load generator", "#66a61e"),
    ):
        series = tl.get("cpu_pct", {}).get(name)
        if series and series["t"]:
            label = "CPU whole machine" if name == "host" else f"CPU {name}"
            d2.plot(series["t"], series["pct"], color=color, lw=0.8, ls="--", label=label)
    d2.set_ylabel("CPU % (100 = 1 core)")
    d2.set_ylim(bottom=0)
    h1, l1 = d.get_legend_handles_labels()
    h2, l2 = d2.get_legend_handles_labels()
    d.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=7)
    d.set_xlabel("seconds since the open loop started")

    spans = [(st, en, name) for name, st, en in tl["phases"]]
    harness.shade_spans((a, b, c, d), spans, label_ax=a)
    harness.mark_events((a, b, c, d), [(e["t_s"], e["event"]) for e in s["events"]], label_ax=b)
    fig.suptitle(
        f"hopserve soak ({s['mode']}): open loop at {s['load']['rate_qps']:.0f} QPS", y=0.995
    )
    harness.save_figure(fig, path)
