"""Prometheus metrics of a hopserve process: one table of specs, one :class:`Metrics` object.

:data:`METRICS` is the single source of truth for every metric name, type, label set and
help string; :class:`Metrics` builds them in its own :class:`CollectorRegistry` (so tests
can create isolated instances) and ``server/METRICS.md`` is generated from the table::

    python -m hopserve.server.metrics > server/METRICS.md

Names are a contract with the dashboards: ``hopserve_`` prefix, base units (seconds,
bytes), ``_total`` for counters. Change the table, regenerate the file, and the test in
``tests/server/test_metrics.py`` keeps both in step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from hopserve.proto import contract
from hopserve.security.gate import REFUSAL_REASONS

__all__ = [
    "METRICS",
    "STAGES",
    "CacheMetrics",
    "MetricSpec",
    "Metrics",
    "render_markdown",
]

STAGES = contract.STAGES
"""Allowed values of the ``stage`` label of ``hopserve_stage_duration_seconds`` (the
contract's stage names, one list for the metrics, the wire and the client)."""

MEMORY_KINDS: tuple[str, ...] = ("used", "total", "peak")
"""Allowed values of the ``kind`` label of ``hopserve_worker_device_memory_bytes``."""

# 0.1 ms .. 10 s, roughly x2.5 per step.
_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_REQUEST_BUCKETS = _LATENCY_BUCKETS[2:]  # 0.5 ms .. 10 s
_CACHE_OP_BUCKETS = _LATENCY_BUCKETS[:13]  # 0.1 ms .. 1 s
_BATCH_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TARGET_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_FRONTIER_BUCKETS = (1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8)

MetricType = Literal["counter", "gauge", "histogram", "info"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric as exported (the contract dashboards are built on)."""

    attr: str
    """Attribute of :class:`Metrics` holding the metric object."""
    name: str
    """Exported name (counters end in ``_total``; info metrics in ``_info``)."""
    type: MetricType
    """Prometheus type."""
    labels: tuple[str, ...]
    """Label names, in order (for ``info``: the info keys)."""
    help: str
    """Help text: what one observation or increment means, in base units."""
    buckets: tuple[float, ...] | None = None
    """Histogram bucket upper bounds."""


METRICS: tuple[MetricSpec, ...] = (
    # Requests ---------------------------------------------------------------------------
    MetricSpec(
        "request_duration", "hopserve_request_duration_seconds", "histogram",
        ("method", "model", "outcome"),
        "Time from receiving an RPC to sending its answer, in seconds. outcome is 'ok' "
        "or the gRPC status code name in lower case (e.g. 'invalid_argument').",
        _REQUEST_BUCKETS,
    ),
    MetricSpec(
        "requests", "hopserve_requests_total", "counter",
        ("method", "model", "outcome"),
        "RPCs answered, by outcome ('ok' or the lower-case gRPC status code name); "
        "the error ratio is the rate of outcome!='ok' over the total.",
    ),
    MetricSpec(
        "refused", "hopserve_refused_requests_total", "counter", ("reason",),
        "RPCs refused before reaching the service (not in hopserve_requests_total): "
        "reason is unauthenticated, permission_denied or rate_limited.",
    ),
    MetricSpec(
        "requested_rows", "hopserve_requested_rows_total", "counter", ("model", "node_type"),
        "Embedding rows asked for (node IDs of GetEmbeddings and stream requests, "
        "duplicates included), by the node type they name: a typed graph's type, or 'any' "
        "for store-wide IDs.",
    ),
    MetricSpec(
        "inflight_requests", "hopserve_inflight_requests", "gauge", ("model",),
        "RPCs received and not yet answered.",
    ),
    MetricSpec(
        "queue_depth", "hopserve_queue_depth", "gauge", ("model",),
        "Requests waiting in the batcher queue (bounded by server.max_queue).",
    ),
    # Pipeline stages ------------------------------------------------------------------
    MetricSpec(
        "stage_duration", "hopserve_stage_duration_seconds", "histogram", ("model", "stage"),
        "Time spent in one pipeline stage for one batch or request, in seconds; stage is "
        "one of " + ", ".join(STAGES) + ".",
        _LATENCY_BUCKETS,
    ),
    MetricSpec(
        "layer_compute", "hopserve_layer_compute_seconds", "histogram", ("model", "layer"),
        "Time to compute one layer (ConvBlock) of one job over its frontier, in seconds; "
        "layer is the 0-based layer index.",
        _LATENCY_BUCKETS,
    ),
    MetricSpec(
        "layer_rows", "hopserve_layer_rows_total", "counter", ("model", "layer", "source"),
        "Rows of intermediate layers 1..L-1 that jobs needed, by source: 'computed' or "
        "'reused' (taken from the worker's layer cache of hub rows, engine.layer_cache_rows); "
        "the reuse ratio is reused over the sum.",
    ),
    MetricSpec(
        "batch_requests", "hopserve_batch_requests", "histogram", ("model",),
        "Requests coalesced into one worker job.",
        _BATCH_REQUEST_BUCKETS,
    ),
    MetricSpec(
        "batch_targets", "hopserve_batch_targets", "histogram", ("model",),
        "Target nodes (after cache hits are removed) in one worker job.",
        _TARGET_BUCKETS,
    ),
    MetricSpec(
        "frontier_nodes", "hopserve_frontier_nodes", "histogram", ("model", "layer"),
        "Nodes in one job's frontier for a layer (nodes whose output that layer computes); "
        "layer is the 0-based layer index.",
        _FRONTIER_BUCKETS,
    ),
    # Cache ------------------------------------------------------------------------------
    MetricSpec(
        "cache_hits", "hopserve_cache_hits_total", "counter", ("model", "backend"),
        "Node ids found in the embedding cache.",
    ),
    MetricSpec(
        "cache_misses", "hopserve_cache_misses_total", "counter", ("model", "backend"),
        "Node ids not found in the embedding cache (including lookups skipped while the "
        "backend is unavailable).",
    ),
    MetricSpec(
        "cache_errors", "hopserve_cache_errors_total", "counter", ("model", "backend"),
        "Failed cache operations plus stored values rejected as corrupt; a failed "
        "operation never fails the request.",
    ),
    MetricSpec(
        "cache_rejected", "hopserve_cache_rejected_total", "counter",
        ("model", "backend", "reason"),
        "Cached values refused by the integrity check and recomputed; reason is format "
        "(length, format, dtype or width), checksum (MAC does not match key and row) or "
        "nonfinite (NaN/Inf). Any increase means corruption or tampering in the cache.",
    ),
    MetricSpec(
        "cache_writeback_dropped", "hopserve_cache_writeback_dropped_rows_total", "counter",
        ("model",),
        "Computed rows not written back to the cache because the write-behind queue was "
        "full (a slow or hung cache); a later miss recomputes them.",
    ),
    MetricSpec(
        "cache_operation_duration", "hopserve_cache_operation_duration_seconds", "histogram",
        ("backend", "op"),
        "Duration of one successful cache backend round trip, in seconds; op is get, put "
        "or ping.",
        _CACHE_OP_BUCKETS,
    ),
    MetricSpec(
        "cache_far_skipped", "hopserve_cache_far_skipped_total", "counter", ("model", "backend"),
        "Node ids the near tier missed that were not looked up in the shared backend, "
        "because it had found fewer than cache.far_min_hit_rate of them lately (one lookup "
        "in 16 still asks); they were computed and written to both tiers.",
    ),
    MetricSpec(
        "cache_up", "hopserve_cache_up", "gauge", ("backend",),
        "1 while the cache backend is reachable, 0 while it is skipped after a failure.",
    ),
    # Workers ----------------------------------------------------------------------------
    MetricSpec(
        "worker_device_memory", "hopserve_worker_device_memory_bytes", "gauge",
        ("worker", "device", "kind"),
        "Device memory of a worker in bytes; kind is used, total or peak (peak since the "
        "worker started).",
    ),
    MetricSpec(
        "worker_up", "hopserve_worker_up", "gauge", ("worker",),
        "1 while the worker answers health checks, else 0.",
    ),
    MetricSpec(
        "worker_jobs", "hopserve_worker_jobs_total", "counter", ("worker", "outcome"),
        "Jobs finished by a worker; outcome is ok, error, oom, cancelled, timeout or "
        "replanned (the worker had applied a later graph update; planned again).",
    ),
    # Living graphs ----------------------------------------------------------------------
    MetricSpec(
        "graph_update_seconds", "hopserve_graph_update_duration_seconds", "histogram",
        ("graph",),
        "UpdateGraph apply latency: check, log append + fsync, snapshot and cache "
        "invalidation, until the answer.",
        _REQUEST_BUCKETS,
    ),
    MetricSpec(
        "graph_rows_invalidated", "hopserve_graph_rows_invalidated", "histogram", ("graph",),
        "Node rows an update batch can change (the exact L-hop downstream set), summed "
        "over the graph's model kinds; their cached rows stop being served.",
        (0, 1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7),
    ),
    MetricSpec(
        "graph_mutations", "hopserve_graph_mutations_total", "counter", ("graph",),
        "Mutations applied (nodes added, edges added or removed, feature rows set).",
    ),
    MetricSpec(
        "graph_seq", "hopserve_graph_seq", "gauge", ("graph",),
        "Graph sequence this process has applied.",
    ),
    MetricSpec(
        "graph_log_batches", "hopserve_graph_log_batches", "gauge", ("graph",),
        "Update batches in the graph's log beyond its base store (compaction folds them in).",
    ),
    MetricSpec(
        "graph_compaction_seconds", "hopserve_graph_compaction_duration_seconds", "histogram",
        ("graph",),
        "Duration of one compaction of the update log into a new base store.",
        (0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800),
    ),
    # Models and build -------------------------------------------------------------------
    MetricSpec(
        "model_ready", "hopserve_model_ready", "gauge", ("model", "version"),
        "1 when the model version is loaded and serving, 0 while loading (or failed, or "
        "after shutdown); a version unloaded at run time has no series (so no alert).",
    ),
    MetricSpec(
        "model_stalled", "hopserve_model_stalled", "gauge", ("model",),
        "1 while requests for the model wait and none of its batches has finished for "
        "server.stall_timeout_s (a hung or lost worker); its health is NOT_SERVING then.",
    ),
    MetricSpec(
        "build_info", "hopserve_build_info", "info", ("version",),
        "Always 1; labels carry the hopserve version of this process.",
    ),
)  # fmt: skip
"""Every metric hopserve exports, in documentation order."""


class CacheMetrics:
    """Adapter from cache events (``hopserve.server.cache.CacheObserver``) to metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def cache_lookup(self, backend: str, model: str, hits: int, misses: int) -> None:
        """Count ``hits`` and ``misses`` node ids."""
        if hits:
            self._m.cache_hits.labels(model, backend).inc(hits)
        if misses:
            self._m.cache_misses.labels(model, backend).inc(misses)

    def cache_error(self, backend: str, model: str, op: str, count: int) -> None:
        """Count ``count`` errors (``op`` is not a label of the exported counter)."""
        self._m.cache_errors.labels(model, backend).inc(count)

    def cache_rejected(self, backend: str, model: str, reason: str, count: int) -> None:
        """Count values refused by the integrity check."""
        self._m.cache_rejected.labels(model, backend, reason).inc(count)

    def cache_operation(self, backend: str, op: str, seconds: float) -> None:
        """Observe one backend round trip."""
        self._m.cache_operation_duration.labels(backend, op).observe(seconds)

    def cache_available(self, backend: str, up: bool) -> None:
        """Set ``hopserve_cache_up``."""
        self._m.cache_up.labels(backend).set(1 if up else 0)

    def cache_far_skipped(self, backend: str, model: str, count: int) -> None:
        """Count near misses not looked up in the shared tier."""
        self._m.cache_far_skipped.labels(model, backend).inc(count)


class Metrics:
    """All hopserve metrics, registered in one registry.

    Every :data:`METRICS` entry becomes an attribute named by its ``attr``
    (``metrics.request_duration.labels(method, model, outcome).observe(s)``).

    Args:
        registry: Where to register; ``None`` creates a fresh, private registry.
        process_collectors: Also register the standard process, platform and GC
            collectors (``process_resident_memory_bytes``, ...).
        version: Value of ``hopserve_build_info{version}``; default: the package version.
    """

    request_duration: Histogram
    requests: Counter
    inflight_requests: Gauge
    queue_depth: Gauge
    stage_duration: Histogram
    layer_compute: Histogram
    batch_requests: Histogram
    batch_targets: Histogram
    frontier_nodes: Histogram
    cache_hits: Counter
    cache_misses: Counter
    cache_errors: Counter
    cache_rejected: Counter
    cache_writeback_dropped: Counter
    cache_operation_duration: Histogram
    cache_up: Gauge
    worker_device_memory: Gauge
    worker_up: Gauge
    worker_jobs: Counter
    layer_rows: Counter
    graph_update_seconds: Histogram
    graph_rows_invalidated: Histogram
    graph_mutations: Counter
    graph_seq: Gauge
    graph_log_batches: Gauge
    graph_compaction_seconds: Histogram
    model_ready: Gauge
    model_stalled: Gauge
    refused: Counter
    build_info: Info

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        process_collectors: bool = True,
        version: str | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        for spec in METRICS:
            setattr(self, spec.attr, _build(spec, self.registry))
        for reason in REFUSAL_REASONS:  # exported as 0 before the first refusal
            self.refused.labels(reason)
        if process_collectors:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        if version is None:
            from hopserve import __version__ as version
        self.build_info.info({"version": version})

    def observe_request(self, method: str, model: str, outcome: str, seconds: float) -> None:
        """Record one answered RPC in the duration histogram and the request counter."""
        self.request_duration.labels(method, model, outcome).observe(seconds)
        self.requests.labels(method, model, outcome).inc()

    def observe_stage(self, model: str, stage: str, seconds: float) -> None:
        """Record time spent in ``stage`` (one of :data:`STAGES`).

        Raises:
            ValueError: unknown stage (label values are part of the contract).
        """
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
        self.stage_duration.labels(model, stage).observe(seconds)

    @contextmanager
    def time_stage(self, model: str, stage: str) -> Iterator[None]:
        """Context manager observing the wall time of its body as ``stage``."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stage_duration.labels(model, stage).observe(time.perf_counter() - start)

    def set_worker_memory(self, worker: str, device: str, used: int, total: int, peak: int) -> None:
        """Set the three ``hopserve_worker_device_memory_bytes`` series of one device."""
        for kind, value in zip(MEMORY_KINDS, (used, total, peak), strict=True):
            self.worker_device_memory.labels(worker, device, kind).set(value)

    def cache_observer(self) -> CacheMetrics:
        """An observer to pass to the cache (``make_cache(..., observer=...)``)."""
        return CacheMetrics(self)

    def expose(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)


def _build(spec: MetricSpec, registry: CollectorRegistry) -> Counter | Gauge | Histogram | Info:
    if spec.type == "counter":
        return Counter(spec.name, spec.help, spec.labels, registry=registry)
    if spec.type == "gauge":
        return Gauge(spec.name, spec.help, spec.labels, registry=registry)
    if spec.type == "histogram":
        assert spec.buckets is not None, spec.name
        return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)
    return Info(spec.name.removesuffix("_info"), spec.help, registry=registry)


def render_markdown() -> str:
    """``server/METRICS.md``, generated from :data:`METRICS`."""
    lines = [
        "# hopserve metrics",
        "",
        "<!-- Generated by `python -m hopserve.server.metrics > server/METRICS.md`;",
        "     edit METRICS in server/metrics.py, not this file. -->",
        "",
        "Every hopserve process exports these on `/metrics` (front-end: `server.metrics_port`).",
        "Names and labels are a contract for dashboards and alerts: base units (seconds,",
        "bytes), `hopserve_` prefix, `_total` counters. Histograms also export `_bucket`,",
        "`_sum` and `_count` series (so request rates come from",
        "`hopserve_request_duration_seconds_count`). The standard `process_*`, `python_*`",
        "collectors are exported as well.",
        "",
        "| name | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    for spec in METRICS:
        labels = ", ".join(f"`{label}`" for label in spec.labels)
        lines.append(f"| `{spec.name}` | {spec.type} | {labels} | {spec.help} |")
    lines += [
        "",
        "## Label values",
        "",
        "- `stage`: " + ", ".join(f"`{s}`" for s in STAGES) + ".",
        "- `kind`: " + ", ".join(f"`{k}`" for k in MEMORY_KINDS) + ".",
        "- `outcome` (requests): `ok` or the gRPC status code name in lower case.",
        "- `outcome` (worker jobs): `ok`, `error`, `oom`, `cancelled`, `timeout`.",
        "- `backend`: `redis`, `redis-cluster`, `memory`, `none`; `op`: `get`, `put`, `ping`.",
        "- `reason` (cache rejected): `format`, `checksum`, `nonfinite`.",
        "- `layer`: 0-based layer (ConvBlock) index; `method`: the RPC method name.",
        "",
        "## Histogram buckets",
        "",
        "| name | bucket upper bounds |",
        "|---|---|",
    ]
    for spec in METRICS:
        if spec.buckets is not None:
            bounds = ", ".join(
                str(int(b)) if float(b).is_integer() else f"{b:g}" for b in spec.buckets
            )
            lines.append(f"| `{spec.name}` | {bounds} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
