"""Generate the provisioned Grafana dashboards in ``deploy/grafana/dashboards/``.

::

    python deploy/grafana/build_dashboards.py          # rewrite the JSON files
    python deploy/grafana/build_dashboards.py --check  # exit 1 if they are out of date

The dashboards are data (the typed model of ``grafana_json.py``), rendered to Grafana's
dashboard JSON (schema 39, Grafana 10/11). Edit this file, regenerate, commit both: a test fails when
the committed JSON differs from what this script writes, and another evaluates every
panel query against a real Prometheus scraping a live hopserve.

Conventions (checked by ``tests/deploy``):

* every query on a metric that has a ``model`` label filters it with
  ``model=~"$model"``; the ``model`` variable lists ``hopserve_model_ready``'s models;
* rates use ``$__rate_interval``; metric names are those of ``server/metrics.py``;
* ratios whose numerator series may not exist yet (no error so far) fall back to
  ``... or <denominator> * 0`` so panels show 0 instead of "No data".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from grafana_json import Dashboard, Panel, Query, Row, dump

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "dashboards"
DEPLOY_CONFIG = HERE.parent / "hopserve.yaml"

M = 'model=~"$model"'
RATE = "$__rate_interval"
EMBED = 'method=~"GetEmbeddings|StreamEmbeddings"'
# Outcomes that are the caller's doing (bad IDs, unknown model, caller went away).
CLIENT_OUTCOMES = "ok|invalid_argument|not_found|cancelled"

# ---------------------------------------------------------------------------- helpers


def rate(selector: str) -> str:
    return f"rate({selector}[{RATE}])"


def total(by: str, expr: str) -> str:
    """``sum by (by) (expr)``, or ``sum(expr)`` when ``by`` is empty."""
    return f"sum by ({by}) ({expr})" if by else f"sum({expr})"


def quantile(q: float, metric: str, matchers: str, by: str = "") -> str:
    """``histogram_quantile`` over ``metric``'s buckets, summed by ``by`` and ``le``."""
    group = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, {total(group, rate(selector(f'{metric}_bucket', matchers)))})"


def mean(metric: str, matchers: str, by: str) -> str:
    """Mean observation of a histogram: rate of ``_sum`` over rate of ``_count``."""
    return (
        f"{total(by, rate(selector(f'{metric}_sum', matchers)))} / "
        f"{total(by, rate(selector(f'{metric}_count', matchers)))}"
    )


def or_zero(selector: str, fallback: str, by: str) -> str:
    """Summed rate of ``selector``, 0 for each group where only ``fallback`` has series
    (a counter such as the errors of a model exists only after its first increment)."""
    return f"{total(by, rate(selector))} or {total(by, rate(fallback))} * 0"


def ratio_or_zero(numerator: str, denominator: str, by: str) -> str:
    """``sum(rate(numerator)) / sum(rate(denominator))`` by ``by``; 0, not "No data",
    while the numerator has no series."""
    return f"({or_zero(numerator, denominator, by)}) / {total(by, rate(denominator))}"


def hit_ratio(by: str) -> str:
    """Cache hits over lookups (hits + misses) of the selected models."""
    hits = total(by, rate(f"hopserve_cache_hits_total{{{M}}}"))
    misses = total(by, rate(f"hopserve_cache_misses_total{{{M}}}"))
    return f"{hits} / ({hits} + {misses})"


def selector(metric: str, matchers: str) -> str:
    return f"{metric}{{{matchers}}}" if matchers else metric


def max_queue() -> int:
    """``server.max_queue`` of the deployed config (the queue-depth threshold line)."""
    config = yaml.safe_load(DEPLOY_CONFIG.read_text())
    return int(config["server"]["max_queue"])


# ---------------------------------------------------------------------------- dashboards


def overview() -> Dashboard:
    latency = [
        Query(quantile(q, "hopserve_request_duration_seconds", f'{M}, {EMBED}, outcome="ok"',
                       "model"), f"{{{{model}}}} p{round(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    ]  # fmt: skip
    stats = Row(
        "Service level",
        (
            Panel("Requests/s", (Query(f"sum({rate(f'hopserve_requests_total{{{M}}}')})"),),
                  "RPCs answered per second (all methods and outcomes).", unit="reqps",
                  kind="stat", width=4, height=4),
            Panel("Error ratio", (Query(ratio_or_zero(
                f'hopserve_requests_total{{{M}, outcome!="ok"}}', f"hopserve_requests_total{{{M}}}",
                "")),),
                "Share of RPCs answered with a status other than OK.", unit="percentunit",
                kind="stat", width=4, height=4, thresholds=((0.01, "orange"), (0.05, "red")),
                decimals=2),
            Panel("p99 latency", (Query(quantile(
                0.99, "hopserve_request_duration_seconds", f'{M}, {EMBED}, outcome="ok"')),),
                "99th percentile of successful embedding RPCs (SLO: 250 ms).", unit="s",
                kind="stat", width=4, height=4, thresholds=((0.25, "orange"), (1.0, "red"))),
            Panel("Cache hit ratio", (Query(hit_ratio("")),),
                  "Requested node ids answered from the embedding cache.",
                  unit="percentunit", kind="stat", width=4, height=4, decimals=1),
            Panel("Models ready / stalled",
                  (Query(f"sum(hopserve_model_ready{{{M}}})", "ready"),
                   Query(f"sum(hopserve_model_stalled{{{M}}})", "stalled")),
                  "Model versions loaded and serving (hopserve_model_ready), and models whose "
                  "batches stopped finishing with requests waiting (hopserve_model_stalled; "
                  "their health is NOT_SERVING).", kind="stat", width=4, height=4,
                  decimals=0),
            Panel("Workers up", (Query("sum(hopserve_worker_up)"),),
                  "Workers answering health checks, summed over front-ends.", kind="stat",
                  width=4, height=4, decimals=0),
        ),
    )  # fmt: skip
    traffic = Row(
        "Traffic and errors",
        (
            Panel("Requests/s by model and outcome",
                  (Query(f"sum by (model, outcome) ({rate(f'hopserve_requests_total{{{M}}}')})",
                         "{{model}} {{outcome}}"),),
                  "outcome is ok or the lower-case gRPC status name.", unit="reqps", width=12,
                  stack=True),
            Panel("Error ratio by model",
                  (Query(ratio_or_zero(f'hopserve_requests_total{{{M}, outcome!="ok"}}',
                                       f"hopserve_requests_total{{{M}}}", "model"),
                         "{{model}} all non-OK"),
                   Query(ratio_or_zero(
                       f'hopserve_requests_total{{{M}, outcome!~"{CLIENT_OUTCOMES}"}}',
                       f"hopserve_requests_total{{{M}}}", "model"),
                       "{{model}} server-side")),
                  "All non-OK outcomes, and server-side ones only (without invalid_argument, "
                  "not_found and cancelled: what HopserveHighErrorRatio alerts on).",
                  unit="percentunit", width=12, thresholds=((0.05, "red"),)),
            Panel("Refused requests/s by reason",
                  (Query(f"sum by (reason) ({rate('hopserve_refused_requests_total')})",
                         "{{reason}}"),),
                  "RPCs the security gate refused before the service saw them (not in the "
                  "request counts above): unauthenticated (no or unknown token), "
                  "permission_denied (token without the scope), rate_limited (client over "
                  "security.rate_limit).", unit="reqps", width=12, stack=True),
            Panel("Rows requested/s by node type",
                  (Query(f"sum by (model, node_type) "
                         f"({rate(f'hopserve_requested_rows_total{{{M}}}')})",
                         "{{model}} {{node_type}}"),),
                  "Node IDs asked for per second, by the node type a request names on a "
                  "typed graph ('any': store-wide IDs).", unit="short", width=12, stack=True),
        ),
    )  # fmt: skip
    latency_row = Row(
        "Latency",
        (
            Panel("Latency p50 / p95 / p99", tuple(latency),
                  "Successful GetEmbeddings and StreamEmbeddings RPCs, receive to answer.",
                  unit="s", width=12, thresholds=((0.25, "red"),)),
            Panel("p99 latency by method",
                  (Query(quantile(0.99, "hopserve_request_duration_seconds", M, "method"),
                         "{{method}}"),),
                  "All outcomes.", unit="s", width=12),
        ),
    )  # fmt: skip
    load = Row(
        "Cache, concurrency and queues",
        (
            Panel("Cache hit ratio", (Query(hit_ratio("model"), "{{model}}"),),
                  "Node ids found in the cache over all looked up.", unit="percentunit",
                  width=8, max=1),
            Panel("In-flight requests",
                  (Query(f"sum by (model) (hopserve_inflight_requests{{{M}}})", "{{model}}"),),
                  "RPCs received and not yet answered.", width=8),
            Panel("Queue depth",
                  (Query(f"max by (model, instance) (hopserve_queue_depth{{{M}}})",
                         "{{model}} {{instance}}"),),
                  f"Requests waiting in the batcher; the line is server.max_queue "
                  f"({max_queue()}), beyond which requests are refused.", width=8,
                  thresholds=((max_queue(), "red"),)),
        ),
    )  # fmt: skip
    return Dashboard(
        "hopserve-overview",
        "hopserve / Overview",
        "Service level of the hopserve front-ends: traffic, errors, latency, cache, queues.",
        (stats, traffic, latency_row, load),
    )


def engine() -> Dashboard:
    stage = "hopserve_stage_duration_seconds"
    stages = Row(
        "Pipeline stages",
        (
            Panel("Stage latency p95", (Query(quantile(0.95, stage, M, "stage"), "{{stage}}"),),
                  "Per batch (planning, prepare, compute, transfer) or per request "
                  "(cache_lookup, queue_wait, write_back).", unit="s", width=12),
            Panel("Time spent per stage, per second",
                  (Query(f"sum by (stage) ({rate(f'{stage}_sum{{{M}}}')})", "{{stage}}"),),
                  "Seconds spent in each stage per second of wall time (stacked): where "
                  "the front-end and workers spend their time.", unit="s", width=12,
                  stack=True),
        ),
    )  # fmt: skip
    layer = "hopserve_layer_compute_seconds"
    frontier = "hopserve_frontier_nodes"
    rows = "hopserve_layer_rows_total"
    layers = Row(
        "Layers",
        (
            Panel("Per-layer compute p95",
                  (Query(quantile(0.95, layer, M, "layer"), "layer {{layer}}"),),
                  "Time to compute one layer (ConvBlock) of a job; layer 0 is the block "
                  "before the first conv, when there is one.", unit="s", width=6),
            Panel("Per-layer compute, mean per job",
                  (Query(mean(layer, M, "layer"), "layer {{layer}}"),),
                  "Mean seconds per job and layer.", unit="s", width=6),
            Panel("Frontier nodes per layer",
                  (Query(mean(frontier, M, "layer"), "layer {{layer}} mean"),
                   Query(quantile(0.95, frontier, M, "layer"), "layer {{layer}} p95")),
                  "Nodes whose output a layer computes for one job (the last layer's "
                  "frontier is the job's targets).", width=6),
            Panel("Intermediate rows reused",
                  (Query(ratio_or_zero(selector(rows, f'{M},source="reused"'),
                                       selector(rows, M), "layer"), "layer {{layer}}"),),
                  "Share of the intermediate-layer rows jobs needed that workers took from "
                  "their layer cache of hub rows (exact; engine.layer_cache_rows) instead "
                  "of computing them.", unit="percentunit", width=6),
        ),
    )  # fmt: skip
    batching = Row(
        "Batching",
        (
            Panel("Requests per batch",
                  (Query(mean("hopserve_batch_requests", M, "model"), "{{model}} mean"),
                   Query(quantile(0.95, "hopserve_batch_requests", M, "model"),
                         "{{model}} p95")),
                  "Requests the dynamic batcher coalesced into one worker job.", width=8),
            Panel("Targets per batch",
                  (Query(mean("hopserve_batch_targets", M, "model"), "{{model}} mean"),
                   Query(quantile(0.95, "hopserve_batch_targets", M, "model"),
                         "{{model}} p95")),
                  "Target nodes of one job (cache hits removed).", width=8),
            Panel("Worker jobs/s",
                  (Query(f"sum by (model) ({rate(f'hopserve_batch_requests_count{{{M}}}')})",
                         "{{model}}"),),
                  "Batches dispatched to workers per second.", unit="ops", width=8),
        ),
    )  # fmt: skip
    workers = Row(
        "Workers",
        (
            Panel("Device memory per worker",
                  (Query("max by (worker, device, kind) (hopserve_worker_device_memory_bytes)",
                         "{{worker}} {{device}} {{kind}}"),),
                  "used, total and peak (since the worker started) device memory, as "
                  "reported to the front-ends.", unit="bytes", width=12),
            Panel("Worker jobs/s by outcome",
                  (Query(f"sum by (worker, outcome) ({rate('hopserve_worker_jobs_total')})",
                         "{{worker}} {{outcome}}"),),
                  "outcome: ok, error, oom, cancelled, timeout.", unit="ops", width=6),
            Panel("Workers up",
                  (Query("min by (worker) (hopserve_worker_up)", "{{worker}}"),),
                  "1 while the worker answers health checks.", width=6, max=1, decimals=0),
        ),
    )  # fmt: skip
    graphs = Row(
        "Graph updates",
        (
            Panel("Mutations/s",
                  (Query(f"sum by (graph) ({rate('hopserve_graph_mutations_total')})",
                         "{{graph}}"),),
                  "Nodes added, edges added or removed and feature rows set per second "
                  "(UpdateGraph).", unit="ops", width=6),
            Panel("Update apply latency p50 / p99",
                  (Query(quantile(0.5, "hopserve_graph_update_duration_seconds", "", "graph"),
                         "{{graph}} p50"),
                   Query(quantile(0.99, "hopserve_graph_update_duration_seconds", "", "graph"),
                         "{{graph}} p99")),
                  "Check, log append + fsync, snapshot and cache invalidation, until the "
                  "answer.", unit="s", width=6),
            Panel("Rows invalidated per update",
                  (Query(mean("hopserve_graph_rows_invalidated", "", "graph"),
                         "{{graph}} mean"),
                   Query(quantile(0.99, "hopserve_graph_rows_invalidated", "", "graph"),
                         "{{graph}} p99")),
                  "The exact L-hop downstream set of a batch: large when it touches a hub.",
                  width=6),
            Panel("Graph sequence and log length",
                  (Query("max by (graph) (hopserve_graph_seq)", "{{graph}} seq"),
                   Query("max by (graph) (hopserve_graph_log_batches)", "{{graph}} log"),
                   Query(f"sum by (graph) ({rate('hopserve_graph_compaction_duration_seconds_count')})",
                         "{{graph}} compactions/s")),
                  "Sequence applied by this process; batches in the log beyond the base "
                  "store (compaction folds them in).", width=6),
        ),
    )  # fmt: skip
    return Dashboard(
        "hopserve-engine",
        "hopserve / Engine",
        "Where time goes: pipeline stages, per-layer compute, frontier sizes, dynamic "
        "batching, worker devices and graph updates.",
        (stages, layers, batching, workers, graphs),
    )


def cache() -> Dashboard:
    hits = "hopserve_cache_hits_total"
    misses = "hopserve_cache_misses_total"
    errors = "hopserve_cache_errors_total"
    op = "hopserve_cache_operation_duration_seconds"
    stats = Row(
        "Cache",
        (
            Panel("Hit ratio", (Query(hit_ratio("")),), "Over all selected models.",
                  unit="percentunit", kind="stat", width=6, height=4, decimals=1),
            Panel("Lookups/s", (Query(
                f"sum({rate(f'{hits}{{{M}}}')}) + sum({rate(f'{misses}{{{M}}}')})"),),
                "Node ids looked up per second.", kind="stat", width=6, height=4),
            Panel("Errors/s", (Query(or_zero(f"{errors}{{{M}}}", f"{misses}{{{M}}}", "")),),
                  "Failed cache operations and corrupt values per second.", unit="ops",
                  kind="stat", width=6, height=4, thresholds=((0.001, "orange"),)),
            Panel("Cache up", (Query("min(hopserve_cache_up)"),),
                  "1 while every front-end reaches its cache backend.", kind="stat",
                  width=6, height=4, decimals=0),
        ),
    )  # fmt: skip
    effectiveness = Row(
        "Effectiveness",
        (
            Panel("Hits and misses",
                  (Query(f"sum by (model) ({rate(f'{hits}{{{M}}}')})", "{{model}} hits"),
                   Query(f"sum by (model) ({rate(f'{misses}{{{M}}}')})", "{{model}} misses"),
                   Query(or_zero(f"hopserve_cache_far_skipped_total{{{M}}}", f"{misses}{{{M}}}",
                                 "model"), "{{model}} near misses not asked of Redis")),
                  "Node ids per second (misses include lookups skipped while the backend "
                  "is down). Near misses not asked of Redis: it found under "
                  "cache.far_min_hit_rate of them lately (1 lookup in 16 still asks).",
                  width=12),
            Panel("Hit ratio by model", (Query(hit_ratio("model"), "{{model}}"),),
                  "Falls after a model version or graph bump (new keys), then recovers.",
                  unit="percentunit", width=12, max=1),
        ),
    )  # fmt: skip
    backend = Row(
        "Backend",
        (
            Panel("Errors/s",
                  (Query(or_zero(f"{errors}{{{M}}}", f"{misses}{{{M}}}", "model, backend"),
                         "{{model}} {{backend}}"),
                   Query(or_zero(f"hopserve_cache_writeback_dropped_rows_total{{{M}}}",
                                 f"{misses}{{{M}}}", "model"),
                         "{{model}} write-back rows dropped")),
                  "Failed operations plus stored values rejected as corrupt (never fail a "
                  "request), and computed rows not written back because the write-behind "
                  "queue was full (a slow or hung cache; recomputed on a later miss).",
                  unit="ops", width=8),
            Panel("Operation latency",
                  (Query(quantile(0.5, op, "", "backend, op"), "{{backend}} {{op}} p50"),
                   Query(quantile(0.99, op, "", "backend, op"), "{{backend}} {{op}} p99")),
                  "One backend round trip (Redis MGET / SET pipeline, PING).", unit="s",
                  width=8),
            Panel("Operations/s",
                  (Query(f"sum by (backend, op) ({rate(f'{op}_count')})", "{{backend}} {{op}}"),),
                  "Successful backend round trips per second.", unit="ops", width=8),
            Panel("Cache up",
                  (Query("min by (backend, instance) (hopserve_cache_up)",
                         "{{backend}} {{instance}}"),),
                  "0 while a front-end skips its backend after a failure.", width=8, max=1,
                  decimals=0),
            Panel("Values refused by the integrity check/s",
                  (Query(or_zero(f"hopserve_cache_rejected_total{{{M}}}", f"{misses}{{{M}}}",
                                 "model, backend, reason"),
                         "{{model}} {{backend}} {{reason}}"),),
                  "Cached values whose envelope failed (format, checksum) or that held "
                  "NaN/Inf: recomputed and overwritten, never served. Any rate means "
                  "corruption or tampering in the cache.", unit="ops", width=8,
                  thresholds=((0.001, "red"),)),
            Panel("Lookup and write-back, front-end view",
                  (Query(quantile(0.95, "hopserve_stage_duration_seconds",
                                  f'{M}, stage=~"cache_lookup|write_back"', "stage"),
                         "{{stage}} p95"),),
                  "p95 of the cache_lookup and write_back stages.", unit="s", width=8),
        ),
    )  # fmt: skip
    return Dashboard(
        "hopserve-cache",
        "hopserve / Cache",
        "The embedding cache: hits, misses, errors, backend latency and availability.",
        (stats, effectiveness, backend),
    )


DASHBOARDS = {"overview": overview, "engine": engine, "cache": cache}


def generated() -> dict[Path, str]:
    """``{path: text}`` of every dashboard file this script writes."""
    return {OUT_DIR / f"{name}.json": dump(build()) for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".json.tmp")
            partial.write_text(text)
            partial.replace(path)  # atomic: Grafana never loads a half-written file
            print(f"wrote {path}")
    if args.check and stale:
        names = ", ".join(str(p) for p in stale)
        print(f"stale: {names}; run python deploy/grafana/build_dashboards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
