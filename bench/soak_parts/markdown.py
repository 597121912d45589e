"""The soak report in markdown: phases, faults and recovery, checker, log, goals."""

from __future__ import annotations

from typing import Any

import harness

from .common import fmt_codes, md_escape, num


def markdown(s: dict[str, Any], png_name: str) -> list[str]:
    """The report: per-phase table, faults, shutdown, checker, goals."""
    load, g = s["load"], s["graph"]
    mx = load["max_qps_closed_loop"]
    rev = s.get("revision") or {}
    built = (
        f" hopserve {rev['commit'][:10]}{' + uncommitted changes' if rev.get('dirty') else ''}."
        if rev
        else ""
    )
    lines = [
        f"# Soak — {s['minutes']:g} min ({s['mode']}), open loop at {load['rate_qps']:.0f} QPS"
        + (f" ({load['load_fraction']:g} × max {mx:.0f})" if mx else ""),
        "",
        f"{s['model']}; {g['nodes']:,}-node power-law graph ({g['edges']:,} edges, external IDs "
        f"{g['external_ids']}); front-end + one remote worker + Redis cache (maxmemory "
        f"{s['redis_maxmemory']}, allkeys-lru); {harness.machine_line(s['machine'])} — all "
        f"processes share it. Load: {load['arrivals']} arrivals, Zipf a={load['zipf_a']} over the "
        f"graph's external IDs, set sizes log-normal (median {load['set_size_median']}), "
        f"client timeout {load['timeout_s']:g} s, no client retries. Latency is measured from "
        "the scheduled arrival (open loop). Requests = load generator + checker "
        f"(+ drain probes at shutdown).{built}",
        "",
        closed_loop_line(load),
        "",
        "## Phases",
        "",
    ]
    rows = []
    for p in s["phases"]:
        rows.append(
            [
                p["phase"],
                f"{p['start_s']:.1f}",
                f"{p['duration_s']:.1f}",
                p["requests"],
                fmt_codes(p["errors"]) or "-",
                fmt_codes({k: v for k, v in p["server_outcomes"].items() if k != "ok"}) or "-",
                f"{p['qps_ok']:.0f}",
                num(p["p50_ms"], ".1f"),
                num(p["p99_ms"], ".1f"),
                num(p["server_ms"]["p99"], ".0f"),
                num(p["cache_hit_pct"], ".0f"),
                num(p["rss_start_mb"], ".0f"),
                num(p["rss_end_mb"], ".0f"),
                num(p["rss_growth_pct"], "+.1f"),
                p["wrong_rows"],
            ]
        )
    lines += harness.markdown_table(
        [
            "phase",
            "start (s)",
            "s",
            "requests",
            "errors (client)",
            "errors (front-end /metrics)",
            "QPS (ok)",
            "p50 (ms)",
            "p99 (ms)",
            "front-end p99 (ms)",
            "cache hit %",
            "RSS start (MB)",
            "RSS end (MB)",
            "RSS Δ %",
            "wrong rows",
        ],
        rows,
        "lrrrllrrrrrrrrr",
    )
    lines += [
        "",
        "A request belongs to the phase in which it was sent (one sent just before a fault can "
        "fail in the next phase's fault). Client errors are what the client saw; the "
        "front-end's own count (`hopserve_requests_total`, scraped every "
        f"{s['scrape_interval_s']:g} s, so boundaries are approximate) tells whether an answer "
        "was the front-end's or the transport's; front-end p99 is its own receipt-to-answer "
        "time of successful requests (histogram buckets, coarse): far below the client's p99 "
        "means the time was lost before the request reached the handler (client, transport, "
        "a descheduled process).",
    ]
    w, r, sd, rss = s["worker"], s["redis"], s["shutdown"], s["rss"]
    lines += [
        "",
        "## Faults and recovery",
        "",
        f"* **Redis** SIGKILL at {r['killed_at_s']:.1f} s, back at {r['back_at_s']:.1f} s "
        f"(down {r['down_s']:.1f} s, data lost). Errors while down: "
        f"{fmt_codes(r['errors_while_down']) or 'none'}. First cache hit "
        f"{num(r['recovery_first_hit_s'], '.2f')} s after Redis was back.",
        f"* **Worker** SIGKILL at {w['killed_at_s']:.1f} s, restarted at {w['restarted_at_s']:.1f}"
        f" s, SERVING at {w['serving_at_s']:.1f} s (boot {w['boot_s']:.1f} s). First successful "
        f"request that needed the worker {num(w['recovery_first_ok_s'], '.2f')} s after "
        f"SERVING; error rate back to 0 after {w['recovery_error_free_s']:.2f} s. Window "
        f"{w['window_s']:.1f} s: errors {fmt_codes(w['errors_in_window']) or 'none'} "
        f"(error latency p50 {num(w['error_latency_ms']['p50'], '.1f')} ms, p99 "
        f"{num(w['error_latency_ms']['p99'], '.1f')} ms; {w['errors_after_serving']} of them "
        f"sent after SERVING; the front-end counted "
        f"{fmt_codes(w['server_outcomes_in_window']) or '-'}); {w['ok_in_window']} requests "
        "succeeded in the window, "
        f"{w['ok_in_window_fully_cached']} of them entirely from the cache.",
        f"* **Shutdown** SIGTERM at {sd['sigterm_at_s']:.1f} s; exit code {sd['exit_code']} after "
        f"{num(sd['exit_s'], '.2f')} s. In flight at SIGTERM: {sd['inflight_at_sigterm']} "
        f"({fmt_codes(sd['inflight_outcomes']) or '-'}; the large bypass drain probes: "
        f"{fmt_codes(sd['inflight_drain_probes']) or '-'}). New requests after SIGTERM: "
        f"{fmt_codes(sd['new_after_sigterm']) or 'none'} (before the exit: "
        f"{fmt_codes(sd['new_after_sigterm_before_exit']) or 'none'}).",
        f"* **RSS** (front-end) {rss['measured']}: {num(rss['baseline_mb'], '.0f')} → "
        f"{num(rss['final_mb'], '.0f')} MB ({num(rss['growth_pct'], '+.1f')}%), peak "
        f"{num(rss['peak_mb'], '.0f')} MB.",
    ]
    c = s["checker"]
    lines += [
        "",
        "## Checker",
        "",
        f"{c.get('samples', 0)} samples ({c.get('rows_compared', 0)} rows): wrong rows served vs "
        f"reference {c.get('served_vs_reference', 0)}, bypass vs reference "
        f"{c.get('bypass_vs_reference', 0)}, served vs bypass {c.get('served_vs_bypass', 0)}; "
        f"{c.get('failed_calls', 0)} checker calls failed (counted in the phase errors). Every "
        f"load-generator response is also compared with the reference. Reference = the model's "
        f"own full-graph forward; LayerwiseEvaluator.evaluate() differs from it by at most "
        f"{g['engine_vs_forward_max_abs']:.1e} ({g['engine_vs_forward_wrong_rows']} rows outside"
        f" the tolerance, floor {g['tolerance_floor']:.1e}).",
        "",
        "## Front-end log (WARNING and above, grouped)",
        "",
    ]
    warnings = s["logs"].get("front-end", {}).get("warnings", [])
    lines += (
        harness.markdown_table(
            ["count", "first (s)", "last (s)", "example"],
            [
                [
                    w["count"],
                    f"{w['first_t_s']:.1f}",
                    f"{w['last_t_s']:.1f}",
                    md_escape(w["example"]),
                ]
                for w in warnings[:8]
            ],
            "rrrl",
        )
        if warnings
        else ["(none)"]
    )
    lines += ["", "## Goals", ""]
    lines += harness.markdown_table(
        ["goal", "measured", "met"],
        [[x["goal"], x["measured"], "met" if x["met"] else "**NOT MET**"] for x in s["goals"]],
        "llc",
    )
    lines += ["", f"![soak timeline]({png_name})"]
    return lines


def closed_loop_line(load: dict[str, Any]) -> str:
    """The max-throughput measurement, one sentence."""
    m = load.get("closed_loop") or {}
    if not m:
        return f"Rate given on the command line: {load['rate_qps']:.0f} QPS (no measurement)."
    return (
        f"Max throughput, measured first (closed loop, concurrency {m['concurrency']}, "
        f"{m['seconds']:g} s): {m['qps']:.0f} QPS, p50 {m['p50_ms']:.1f} ms, p99 "
        f"{m['p99_ms']:.1f} ms, errors {fmt_codes(m['errors']) or 'none'}; the soak offers "
        f"{load['load_fraction']:g} × that. Load-generator schedule lag p99: "
        f"{num(load['schedule_lag_p99_ms'], '.1f')} ms; requests shed by the generator: "
        f"{load['tally'].get('shed', 0)}."
    )
