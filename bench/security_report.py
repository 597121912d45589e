"""Report of ``bench/security.py``: means per configuration, markdown, JSON and the plot.

Kept apart from the measurement (``security.py``) so each reads on its own; the run
records it takes are the dicts ``security.main`` builds, one per run.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import harness


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over one configuration's runs (errors summed)."""

    def avg(get: Any) -> float:
        return statistics.fmean(get(r) for r in runs)

    errors: dict[str, int] = {}
    for r in runs:
        for code, n in r["errors"].items():
            errors[code] = errors.get(code, 0) + n
    out: dict[str, Any] = {
        key: avg(lambda r, k=key: r[k]) for key in ("qps", "p50_ms", "p95_ms", "p99_ms")
    }
    for part in ("cached_16", "connect"):
        out[part] = {k: avg(lambda r, p=part, k=k: r[p][k]) for k in ("p50_ms", "p99_ms")}
    out["cpu"] = {k: avg(lambda r, k=k: r["cpu"][k]) for k in runs[0]["cpu"]}
    out["qps_runs"] = [r["qps"] for r in runs]
    out["cached_16"]["p50_ms_runs"] = [r["cached_16"]["p50_ms"] for r in runs]
    out["errors"] = errors
    out["runs"] = len(runs)
    return out


def report_out(
    args: argparse.Namespace,
    runs: list[dict[str, Any]],
    seconds: float,
    *,
    configs: list[tuple[Any, ...]],
    rate_limit: dict[str, float],
) -> None:
    """``security.{json,md,png}``: mean per configuration with ratios to plaintext (closed
    loop, cached lookups, new connections) and every run. ``configs``: ``(name, ...)`` in
    report order; ``rate_limit``: the ``tls+tokens+limit`` setting."""
    means = {name: mean_of([r for r in runs if r["configuration"] == name]) for name, *_ in configs}
    base = means["plaintext"]
    for m in means.values():
        m["qps_vs_plaintext"] = m["qps"] / base["qps"]
        m["cached_p50_vs_plaintext"] = m["cached_16"]["p50_ms"] / base["cached_16"]["p50_ms"]
        m["connect_p50_vs_plaintext"] = m["connect"]["p50_ms"] / base["connect"]["p50_ms"]
    machine = f"{harness.machine_line()}; no GPU; client and server share these cores"
    summary = {
        "graph": {"nodes": args.nodes, "avg_degree": args.avg_degree},
        "model": "GraphSAGE-mean x2 (64 → 64 → 32)",
        "server": "dynamic batching (2 ms window) + Redis cache, cold at every run's start",
        "load": {
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "zipf_a": args.zipf,
            "set_size_median": args.set_size,
            "set_size_sigma": args.set_size_sigma,
        },
        "security": {
            "tls": "server certificate ECDSA P-256, from a throw-away CA",
            "tokens": "one embeddings:read token, stored as its sha256",
            "rate_limit": rate_limit,
        },
        "repeat": args.repeat,
        "order": [r["configuration"] for r in runs],
        "cached_lookups_per_run": args.lookups,
        "connections_per_run": args.connects,
        "quick": args.quick,
        "machine": machine,
        "machine_info": harness.machine_info(),
        "git": harness.git_revision(),
        "wall_s": seconds,
        "mean": means,
        "runs": runs,
    }
    order = " ".join(summary["order"])
    lines = [
        f"Security cost — {summary['model']}; {args.nodes:,}-node power-law graph; "
        f"{summary['server']}; closed loop at concurrency {args.concurrency} for "
        f"{args.duration:g} s (after {args.warmup:g} s warm-up), Zipf a={args.zipf}, set sizes "
        f"log-normal (median {args.set_size}).",
        "",
        f"Machine: {machine}. TLS and token work lands on the same 2 cores as the load "
        "generator and the model, so **read the ratios to plaintext, not the absolute "
        f"times**. {args.repeat} run(s) per configuration, interleaved in the order "
        f"{order}; every run starts a fresh server on a cold cache and first checks that it "
        "enforces its configuration (plaintext clients refused by the TLS port, calls "
        "without a token UNAUTHENTICATED).",
        "",
        "Closed loop, mean per configuration. Server cores: CPU seconds per second of the "
        "server process over the measured window — the same in every run when the server "
        "is the bottleneck (then QPS is the measure of its per-request work). Client CPU: "
        "milliseconds of the load client's CPU time per answered request.",
        "",
    ]
    lines += harness.markdown_table(
        ["configuration", "QPS", "vs plaintext", "QPS per run", "p50 (ms)", "p95 (ms)",
         "p99 (ms)", "errors", "server cores", "client CPU/request (ms)"],
        [
            [
                name,
                f"{m['qps']:.0f}",
                f"{m['qps_vs_plaintext']:.2f}×",
                " / ".join(f"{q:.0f}" for q in m["qps_runs"]),
                f"{m['p50_ms']:.1f}",
                f"{m['p95_ms']:.1f}",
                f"{m['p99_ms']:.1f}",
                _errors(m["errors"]),
                f"{m['cpu']['server_cores']:.2f}",
                f"{m['cpu']['client_cpu_ms_per_request']:.2f}",
            ]
            for name, m in means.items()
        ],
        "lrrrrrrlrr",
    )  # fmt: skip
    lines += [
        "",
        f"Cached lookups of 16 nodes, one request at a time ({args.lookups} per run, after "
        "warming the cache; end-to-end), mean per configuration:",
        "",
    ]
    lines += harness.markdown_table(
        ["configuration", "p50 (ms)", "p99 (ms)", "p50 vs plaintext", "p50 per run (ms)"],
        [
            [
                name,
                f"{m['cached_16']['p50_ms']:.2f}",
                f"{m['cached_16']['p99_ms']:.2f}",
                f"{m['cached_p50_vs_plaintext']:.2f}×",
                " / ".join(f"{q:.2f}" for q in m["cached_16"]["p50_ms_runs"]),
            ]
            for name, m in means.items()
        ],
        "lrrrr",
    )
    lines += ["", "Every run, in the order run:", ""]
    lines += harness.markdown_table(
        ["run", "configuration", "QPS", "p50 (ms)", "p95 (ms)", "p99 (ms)", "errors",
         "server cores", "client CPU/req (ms)", "cached p50 (ms)", "cached p99 (ms)",
         "connect p50 (ms)"],
        [
            [
                r["run"],
                r["configuration"],
                f"{r['qps']:.0f}",
                f"{r['p50_ms']:.1f}",
                f"{r['p95_ms']:.1f}",
                f"{r['p99_ms']:.1f}",
                _errors(r["errors"]),
                f"{r['cpu']['server_cores']:.2f}",
                f"{r['cpu']['client_cpu_ms_per_request']:.2f}",
                f"{r['cached_16']['p50_ms']:.2f}",
                f"{r['cached_16']['p99_ms']:.2f}",
                f"{r['connect']['p50_ms']:.2f}",
            ]
            for r in runs
        ],
        "rlrrrrlrrrrr",
    )  # fmt: skip
    lines += [
        "",
        f"New connections: {args.connects} fresh clients per run, one after another, each "
        "timed from channel creation to the answer of its first call (a health check, "
        "which no token gates), so the TLS handshake is inside; mean over runs:",
        "",
    ]
    lines += harness.markdown_table(
        ["configuration", "connect p50 (ms)", "connect p99 (ms)", "p50 vs plaintext"],
        [
            [
                name,
                f"{m['connect']['p50_ms']:.2f}",
                f"{m['connect']['p99_ms']:.2f}",
                f"{m['connect_p50_vs_plaintext']:.2f}×",
            ]
            for name, m in means.items()
        ],
        "lrrr",
    )
    lines += [
        "",
        f"Rate limit of `tls+tokens+limit`: {rate_limit['requests_per_s']:g} requests/s "
        f"(burst {rate_limit['burst']:,}) per client, far above the offered load: nothing "
        "is refused, the row measures the token bucket's bookkeeping. Certificates and the "
        "token were generated into a temporary folder for the run and deleted after it.",
    ]
    harness.write_outputs(
        Path(args.out), "security", summary, lines, lambda p: plot(means, runs, p)
    )
    harness.log(f"done in {seconds:.0f} s; results in {args.out}")


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{code} {n}" for code, n in errors.items()) or "-"


def plot(means: dict[str, dict[str, Any]], runs: list[dict[str, Any]], path: Path) -> None:
    """Bars of the mean per configuration (dots: single runs): QPS, cached 16-node p50,
    new-connection p50."""
    plt = harness.pyplot()
    names = list(means)
    x = range(len(names))
    panels = [
        ("throughput (concurrency 32)", "requests / s", lambda r: r["qps"], "#2b7bba"),
        ("cached 16-node lookup, p50", "ms", lambda r: r["cached_16"]["p50_ms"], "#74a9cf"),
        ("new connection + first call, p50", "ms", lambda r: r["connect"]["p50_ms"], "#d95f02"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (title, unit, get, color) in zip(axes, panels, strict=True):
        per_run = {n: [get(r) for r in runs if r["configuration"] == n] for n in names}
        ax.bar(x, [statistics.fmean(per_run[n]) for n in names], color=color)
        for i, n in enumerate(names):
            ax.plot([i] * len(per_run[n]), per_run[n], "o", color="black", ms=3)
        ax.set_xticks(list(x), names, rotation=20, ha="right")
        ax.set_ylabel(unit)
        ax.set_title(title)
    harness.save_figure(fig, path)
