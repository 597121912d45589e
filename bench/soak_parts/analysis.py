"""From the run's records, scrapes and logs to the summary: per-phase numbers, fault
windows, recovery, shutdown, RSS, the checker, and the goals met or not."""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from datetime import datetime
from typing import Any

import harness
import numpy as np
from harness import ServiceProcess

from .common import (
    DRAIN,
    LOAD,
    RECOVERY_GOAL_S,
    RSS_GOAL_PCT,
    SOURCES,
    code_names,
    fmt_codes,
    num,
)
from .plot import timeline
from .run import RunState, Soak


def analyze(soak: Soak) -> dict[str, Any]:
    """Per-phase table, fault windows, recovery, shutdown, RSS, checker and goals."""
    st, plan, args = soak.state, soak.plan, soak.args
    rec = soak.records()
    names = code_names()
    t0 = st.t0
    ok = rec["code"] == 0
    failed = ~ok
    load = rec["source"] == LOAD
    needs_worker = rec["hits"] < rec["n"]
    marks = st.marks
    sigterm = marks["sigterm"]

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    def by_code(mask: np.ndarray) -> dict[str, int]:
        codes, counts = np.unique(rec["code"][mask], return_counts=True)
        return {names.get(int(c), str(c)): int(k) for c, k in zip(codes, counts, strict=True)}

    def rss_at(t_from: float, t_to: float) -> tuple[float | None, float | None]:
        assert soak.rss is not None
        ts, vals = soak.rss.series("front-end")
        inside = [v for t, v in zip(ts, vals, strict=True) if t_from <= t <= t_to]
        if not inside:
            return None, None
        return inside[0] / 2**20, inside[-1] / 2**20

    # -- worker-down window: from the kill to the first success that needed the worker
    w_kill, w_serving = marks["worker_kill"], marks["worker_serving"]
    first_ok = rec["end"][ok & needs_worker & (rec["start"] > w_kill) & (rec["end"] > w_serving)]
    w_recovered = float(first_ok.min()) if first_ok.size else None
    w_end = w_recovered if w_recovered is not None else sigterm
    in_window = (rec["start"] <= w_end) & (rec["end"] >= w_kill)
    after_sigterm = rec["end"] >= sigterm
    inflight_sigterm = (rec["start"] < sigterm) & after_sigterm
    new_after_sigterm = rec["start"] >= sigterm
    window_errors = failed & in_window & ~after_sigterm
    last_err = rec["end"][window_errors]
    error_free_after = max(0.0, float(last_err.max()) - w_serving) if last_err.size else 0.0
    worker = {
        "killed_at_s": rel(w_kill),
        "restarted_at_s": rel(marks["worker_start"]),
        "serving_at_s": rel(w_serving),
        "boot_s": round(w_serving - marks["worker_start"], 3),
        "first_ok_needing_worker_at_s": rel(w_recovered),
        "recovery_first_ok_s": None if w_recovered is None else round(w_recovered - w_serving, 3),
        "recovery_error_free_s": round(error_free_after, 3),
        "window_s": round(w_end - w_kill, 3),
        "errors_in_window": by_code(window_errors),
        "ok_in_window": int((ok & in_window).sum()),
        "ok_in_window_fully_cached": int((ok & in_window & ~needs_worker).sum()),
        "error_latency_ms": harness.percentiles(
            (rec["end"] - rec["start"])[window_errors] * 1e3, (50, 99)
        ),
        "errors_after_serving": int((failed & in_window & (rec["start"] >= w_serving)).sum()),
        "server_outcomes_in_window": server_outcomes(soak.metrics, w_kill, w_end),
    }

    # -- Redis: first cache hit after it is back
    r_kill, r_back = marks["redis_kill"], marks["redis_back"]
    hit_after = rec["end"][ok & (rec["hits"] > 0) & (rec["start"] > r_back)]
    r_first_hit = float(hit_after.min()) if hit_after.size else None
    during_redis = (rec["start"] <= r_back) & (rec["end"] >= r_kill)
    redis = {
        "killed_at_s": rel(r_kill),
        "back_at_s": rel(r_back),
        "down_s": round(r_back - r_kill, 3),
        "first_cache_hit_at_s": rel(r_first_hit),
        "recovery_first_hit_s": None if r_first_hit is None else round(r_first_hit - r_back, 3),
        "errors_while_down": by_code(failed & during_redis),
        "hits_while_down": int(
            rec["hits"][ok & (rec["start"] > r_kill) & (rec["end"] < r_back)].sum()
        ),
    }

    # -- shutdown
    shutdown = {
        "sigterm_at_s": rel(sigterm),
        "exit_code": st.frontend_exit_code,
        "exit_s": None if st.frontend_exit_s is None else round(st.frontend_exit_s, 3),
        "inflight_at_sigterm": int(inflight_sigterm.sum()),
        "inflight_outcomes": by_code(inflight_sigterm),
        "inflight_drain_probes": by_code(inflight_sigterm & (rec["source"] == DRAIN)),
        "new_after_sigterm": by_code(new_after_sigterm),
        "new_after_sigterm_before_exit": by_code(
            new_after_sigterm & (rec["start"] < marks["frontend_exit"])
        ),
        "drain_probe_wrong_rows": int(getattr(soak, "drain_wrong", 0)),
    }

    # -- phases
    phases = []
    for name, start, end in st.phases:
        m = (rec["start"] >= start) & (rec["start"] < end)
        lm = m & load & ok
        lat = (rec["end"] - rec["sched"])[lm] * 1e3
        rows = rec["n"][lm].sum()
        rss_start, rss_end = rss_at(start, end)
        pct = harness.percentiles(lat, (50, 99))
        phases.append(
            {
                "phase": name,
                "start_s": rel(start),
                "duration_s": round(end - start, 3),
                "requests": int(m.sum()),
                "load_requests": int((m & load).sum()),
                "ok": int((m & ok).sum()),
                "errors": by_code(m & failed),
                "qps_ok": float((m & load & ok).sum() / max(end - start, 1e-9)),
                "p50_ms": pct["p50"],
                "p99_ms": pct["p99"],
                "cache_hit_pct": float(100.0 * rec["hits"][lm].sum() / rows) if rows else None,
                "rss_start_mb": rss_start,
                "rss_end_mb": rss_end,
                "rss_growth_pct": (
                    100.0 * (rss_end / rss_start - 1.0) if rss_start and rss_end else None
                ),
                "wrong_rows": int(rec["wrong"][m].sum()),
                "server_outcomes": server_outcomes(soak.metrics, start, end),
                "server_ms": server_latency_ms(soak.metrics, start, end),
            }
        )

    # -- RSS after warm-up: start of steady vs end of steady-2 (medians of 20% windows)
    spans = {name: (s, e) for name, s, e in st.phases}
    ts, vals = soak.rss.series("front-end") if soak.rss else ([], [])
    ts_a, vals_a = np.asarray(ts), np.asarray(vals, dtype=float)

    def median_in(a: float, b: float) -> float | None:
        sel = vals_a[(ts_a >= a) & (ts_a <= b)]
        return float(np.median(sel)) / 2**20 if sel.size else None

    s0, s1 = spans["steady"]
    e0, e1 = spans["steady-2"]
    base = median_in(s0, s0 + 0.2 * (s1 - s0))
    final = median_in(e1 - 0.2 * (e1 - e0), e1)
    peak = float(vals_a[(ts_a >= s0) & (ts_a <= e1)].max()) / 2**20 if vals_a.size else None
    rss = {
        "baseline_mb": base,
        "final_mb": final,
        "peak_mb": peak,
        "growth_pct": 100.0 * (final / base - 1.0) if base and final else None,
        "measured": "median over the first 20% of 'steady' vs the last 20% of 'steady-2'",
    }

    # -- wrong rows
    checker = dict(soak.checker.stats) if soak.checker else {}
    wrong_total = (
        int(rec["wrong"].sum())
        + shutdown["drain_probe_wrong_rows"]
        + sum(
            checker.get(k, 0)
            for k in ("served_vs_reference", "bypass_vs_reference", "served_vs_bypass")
        )
    )

    outside = failed & ~in_window & ~after_sigterm
    window_non_unavailable = {
        k: v for k, v in worker["errors_in_window"].items() if k != "UNAVAILABLE"
    }
    inflight_bad = {
        k: v for k, v in shutdown["inflight_outcomes"].items() if k not in ("OK", "UNAVAILABLE")
    }
    new_bad = {k: v for k, v in shutdown["new_after_sigterm"].items() if k != "UNAVAILABLE"}
    rec_first = worker["recovery_first_ok_s"]
    goals = [
        _goal("0 wrong rows", wrong_total == 0, f"{wrong_total} wrong rows"),
        _goal(
            "0 errors outside the worker-down window (before SIGTERM)",
            not outside.any(),
            fmt_codes(by_code(outside)) or "none",
        ),
        _goal(
            "errors in the worker-down window: UNAVAILABLE only",
            not window_non_unavailable,
            fmt_codes(worker["errors_in_window"]) or "no errors",
        ),
        _goal(
            f"worker recovery ≤ {RECOVERY_GOAL_S:g} s after SERVING",
            rec_first is not None
            and rec_first <= RECOVERY_GOAL_S
            and worker["recovery_error_free_s"] <= RECOVERY_GOAL_S,
            f"first OK needing the worker +{num(rec_first, '.2f')} s; error rate 0 after "
            f"+{worker['recovery_error_free_s']:.2f} s",
        ),
        _goal(
            f"RSS growth < {RSS_GOAL_PCT:g}% after warm-up",
            rss["growth_pct"] is not None and rss["growth_pct"] < RSS_GOAL_PCT,
            f"{num(rss['baseline_mb'], '.0f')} → {num(rss['final_mb'], '.0f')} MB "
            f"({num(rss['growth_pct'], '+.1f')}%)",
        ),
        _goal(
            "clean exit: code 0, in-flight requests drained (OK or UNAVAILABLE only)",
            st.frontend_exit_code == 0 and not inflight_bad and shutdown["inflight_at_sigterm"] > 0,
            f"exit {st.frontend_exit_code} after {num(st.frontend_exit_s, '.2f')} s; "
            f"{shutdown['inflight_at_sigterm']} in flight: "
            f"{fmt_codes(shutdown['inflight_outcomes'])}",
        ),
        _goal(
            "(extra) Redis recovery ≤ 2 s: first cache hit after Redis is back",
            redis["recovery_first_hit_s"] is not None
            and redis["recovery_first_hit_s"] <= RECOVERY_GOAL_S,
            f"+{num(redis['recovery_first_hit_s'], '.2f')} s",
        ),
        _goal(
            "(extra) new requests after SIGTERM: UNAVAILABLE only",
            not new_bad,
            fmt_codes(shutdown["new_after_sigterm"]) or "none",
        ),
    ]

    return {
        "mode": "quick" if args.quick else "full",
        "minutes": args.minutes,
        "plan": asdict(plan),
        "machine": harness.machine_info(),
        "revision": harness.git_revision(),
        "graph": soak.reference_info,
        "model": f"GraphSAGE-mean x{soak.data.kwargs['num_layers']} "
        f"({soak.data.kwargs['in_dim']} → {soak.data.kwargs['hidden']} → "
        f"{soak.data.kwargs['out_dim']})",
        "load": {
            "max_qps_closed_loop": st.measured.get("qps"),
            "closed_loop": st.measured,
            "load_fraction": args.load_fraction,
            "rate_qps": st.rate,
            "arrivals": args.arrivals,
            "zipf_a": args.zipf,
            "set_size_median": args.set_size,
            "set_size_sigma": args.set_size_sigma,
            "timeout_s": args.timeout,
            "tally": st.loadgen_tally,
            "schedule_lag_p99_ms": harness.percentiles(
                (rec["start"] - rec["sched"])[load] * 1e3, (99,)
            )["p99"],
        },
        "redis_maxmemory": args.redis_maxmemory,
        "scrape_interval_s": args.rss_interval,
        "events": [{"t_s": rel(t), "event": label} for t, label in st.events],
        "phases": phases,
        "worker": worker,
        "redis": redis,
        "shutdown": shutdown,
        "rss": rss,
        "checker": {
            **checker,
            "first_wrong": [
                {**b, "t": rel(b["t"])} for b in (soak.checker.bad if soak.checker else [])
            ],
        },
        "requests_by_source": {
            name: int((rec["source"] == i).sum()) for i, name in enumerate(SOURCES)
        },
        "wrong_rows_total": wrong_total,
        "errors_outside_window": by_code(outside),
        "worker_exit_code": st.worker_exit_code,
        "goals": goals,
        "goals_met": all(g["met"] for g in goals if not g["goal"].startswith("(extra)")),
        "timeline": timeline(rec, soak, names),
        "logs": {"front-end": log_events(soak.frontend, st), "worker": log_events(soak.worker, st)},
    }


def server_outcomes(
    scraper: harness.MetricsScraper | None, t_from: float, t_to: float
) -> dict[str, int]:
    """GetEmbeddings answers by outcome as the front-end counted them (``/metrics``
    ``hopserve_requests_total`` between the scrapes around ``t_from`` and ``t_to``)."""
    out: dict[str, int] = {}
    if scraper is None:
        return out
    for key in scraper.matching("hopserve_requests_total", method="GetEmbeddings"):
        after = scraper.value_at(key, t_to)
        if after is None:
            continue
        delta = after - (scraper.value_at(key, t_from) or 0.0)
        outcome = re.search(r'outcome="([^"]*)"', key)
        if delta > 0 and outcome is not None:
            out[outcome.group(1)] = out.get(outcome.group(1), 0) + int(round(delta))
    return out


def server_latency_ms(
    scraper: harness.MetricsScraper | None, t_from: float, t_to: float
) -> dict[str, float]:
    """p50/p99 (ms) of successful GetEmbeddings as the front-end timed them (receipt to
    answer; ``hopserve_request_duration_seconds`` buckets, so coarse)."""
    if scraper is None:
        return {"p50": math.nan, "p99": math.nan}
    q = scraper.histogram_quantiles(
        "hopserve_request_duration_seconds",
        t_from,
        t_to,
        (50, 99),
        method="GetEmbeddings",
        outcome="ok",
    )
    return {k: v * 1e3 for k, v in q.items()}


def _goal(goal: str, met: bool, measured: str) -> dict[str, Any]:
    return {"goal": goal, "met": bool(met), "measured": measured}


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ([\w.]+): (.*)$")


def log_events(proc: ServiceProcess | None, state: RunState) -> dict[str, Any]:
    """WARNING+ lines of a service log, grouped by message shape, with times since ``t0``.

    Also ``breaker_open_s``: when the front-end's Redis cache declared Redis unavailable
    (its circuit breaker opened), for the plot and the report.
    """
    if proc is None:
        return {}
    try:
        lines = proc.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    groups: dict[str, dict[str, Any]] = {}
    breaker: list[float] = []
    for line in lines:
        m = _LOG_LINE.match(line)
        if m is None or m.group(2) not in ("WARNING", "ERROR", "CRITICAL"):
            continue
        stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        t = round(stamp - state.wall_offset - state.t0, 3)
        message = m.group(4)
        shape = re.sub(r"\d+", "N", f"{m.group(2)} {m.group(3)}: {message}")[:90]
        group = groups.setdefault(shape, {"count": 0, "first_t_s": t, "example": message[:240]})
        group["count"] += 1
        group["last_t_s"] = t
        if "redis_cache" in m.group(3) and "unavailable" in message:
            breaker.append(t)
    return {
        "lines": len(lines),
        "warnings": sorted(groups.values(), key=lambda g: -g["count"]),
        "breaker_open_s": breaker,
    }
