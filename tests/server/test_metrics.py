"""hopserve.server.metrics: the spec table, METRICS.md, isolation, exposition over HTTP."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

import hopserve
from hopserve.server.cache import CacheNamespace, MemoryEmbeddingCache, RedisEmbeddingCache
from hopserve.server.metrics import (
    METRICS,
    STAGES,
    Metrics,
    render_markdown,
)

METRICS_MD = Path(__file__).resolve().parents[2] / "server" / "METRICS.md"

# The brief's contract: name -> (type, labels). Changing a name or label breaks dashboards.
CONTRACT = {
    "hopserve_request_duration_seconds": ("histogram", ("method", "model", "outcome")),
    "hopserve_requests_total": ("counter", ("method", "model", "outcome")),
    "hopserve_refused_requests_total": ("counter", ("reason",)),
    "hopserve_stage_duration_seconds": ("histogram", ("model", "stage")),
    "hopserve_layer_compute_seconds": ("histogram", ("model", "layer")),
    "hopserve_layer_rows_total": ("counter", ("model", "layer", "source")),
    "hopserve_batch_requests": ("histogram", ("model",)),
    "hopserve_batch_targets": ("histogram", ("model",)),
    "hopserve_frontier_nodes": ("histogram", ("model", "layer")),
    "hopserve_cache_hits_total": ("counter", ("model", "backend")),
    "hopserve_cache_misses_total": ("counter", ("model", "backend")),
    "hopserve_cache_errors_total": ("counter", ("model", "backend")),
    "hopserve_cache_rejected_total": ("counter", ("model", "backend", "reason")),
    "hopserve_cache_operation_duration_seconds": ("histogram", ("backend", "op")),
    "hopserve_queue_depth": ("gauge", ("model",)),
    "hopserve_inflight_requests": ("gauge", ("model",)),
    "hopserve_worker_device_memory_bytes": ("gauge", ("worker", "device", "kind")),
    "hopserve_worker_up": ("gauge", ("worker",)),
    "hopserve_worker_jobs_total": ("counter", ("worker", "outcome")),
    "hopserve_graph_update_duration_seconds": ("histogram", ("graph",)),
    "hopserve_graph_rows_invalidated": ("histogram", ("graph",)),
    "hopserve_graph_mutations_total": ("counter", ("graph",)),
    "hopserve_graph_seq": ("gauge", ("graph",)),
    "hopserve_graph_log_batches": ("gauge", ("graph",)),
    "hopserve_graph_compaction_duration_seconds": ("histogram", ("graph",)),
    "hopserve_model_ready": ("gauge", ("model", "version")),
    "hopserve_model_stalled": ("gauge", ("model",)),
    "hopserve_build_info": ("info", ("version",)),
}


def family_name(spec_name: str, kind: str) -> str:
    """Name prometheus_client gives the family (without _total / _info)."""
    if kind == "counter":
        return spec_name.removesuffix("_total")
    if kind == "info":
        return spec_name.removesuffix("_info")
    return spec_name


def touch_all(metrics: Metrics) -> None:
    """Create one child of every labelled metric (with the spec's label names)."""
    for spec in METRICS:
        metric = getattr(metrics, spec.attr)
        if spec.type == "info":
            continue
        child = metric.labels(**{label: "x" for label in spec.labels})
        if spec.type == "histogram":
            child.observe(1)
        elif spec.type == "counter":
            child.inc()
        else:
            child.set(1)


def test_spec_table_matches_contract() -> None:
    added = {  # beyond the brief, additive
        "hopserve_cache_up": ("gauge", ("backend",)),
        "hopserve_cache_far_skipped_total": ("counter", ("model", "backend")),
        "hopserve_cache_writeback_dropped_rows_total": ("counter", ("model",)),
        "hopserve_requested_rows_total": ("counter", ("model", "node_type")),
    }
    assert {s.name: (s.type, s.labels) for s in METRICS} == {**CONTRACT, **added}
    assert len({s.attr for s in METRICS}) == len(METRICS)


def test_naming_conventions() -> None:
    for spec in METRICS:
        assert spec.name.startswith("hopserve_"), spec.name
        assert spec.help and spec.help.endswith((".", ")")), spec.name
        assert (spec.type == "counter") == spec.name.endswith("_total"), spec.name
        assert (spec.type == "histogram") == (spec.buckets is not None), spec.name
        if spec.buckets is not None:
            assert list(spec.buckets) == sorted(spec.buckets), spec.name
        if "duration" in spec.name or "compute" in spec.name:
            assert spec.name.endswith("_seconds"), spec.name
        if "memory" in spec.name:
            assert spec.name.endswith("_bytes"), spec.name


def test_request_buckets_span_half_a_millisecond_to_ten_seconds() -> None:
    (spec,) = [s for s in METRICS if s.name == "hopserve_request_duration_seconds"]
    assert spec.buckets is not None
    assert spec.buckets[0] == 0.0005 and spec.buckets[-1] == 10.0


def test_every_metric_is_registered_with_its_labels() -> None:
    metrics = Metrics(process_collectors=False)
    touch_all(metrics)
    families = {f.name: f for f in metrics.registry.collect()}
    for spec in METRICS:
        family = families[family_name(spec.name, spec.type)]
        assert family.type == spec.type, spec.name
        assert family.documentation == spec.help, spec.name
        label_sets = {tuple(sorted(set(s.labels) - {"le"})) for s in family.samples}
        assert label_sets == {tuple(sorted(spec.labels))}, spec.name
        if spec.type != "info":  # wrong label names are refused
            with pytest.raises(ValueError):
                getattr(metrics, spec.attr).labels(wrong_label="x")


def test_metrics_md_is_generated_from_the_table() -> None:
    assert METRICS_MD.read_text() == render_markdown(), (
        "server/METRICS.md is stale: run `python -m hopserve.server.metrics > server/METRICS.md`"
    )


def test_metrics_md_lists_every_metric_with_labels() -> None:
    rows = re.findall(
        r"^\| `(hopserve_\w+)` \| (\w+) \| ([^|]*) \| [^|]+ \|$",
        METRICS_MD.read_text(),
        flags=re.MULTILINE,
    )
    documented = {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows
    }
    assert documented == {s.name: (s.type, s.labels) for s in METRICS}


def test_registries_are_isolated() -> None:
    first, second = Metrics(), Metrics(CollectorRegistry(), process_collectors=False)
    first.observe_request("GetEmbeddings", "m", "ok", 0.01)
    sample = ("hopserve_requests_total", {"method": "GetEmbeddings", "model": "m", "outcome": "ok"})
    assert first.registry.get_sample_value(*sample) == 1
    assert second.registry.get_sample_value(*sample) is None
    count = "hopserve_request_duration_seconds_count"
    assert first.registry.get_sample_value(count, sample[1]) == 1


def test_helpers() -> None:
    metrics = Metrics(process_collectors=False, version="9.9.9")
    get = metrics.registry.get_sample_value
    assert get("hopserve_build_info", {"version": "9.9.9"}) == 1
    assert (
        Metrics(process_collectors=False).registry.get_sample_value(
            "hopserve_build_info", {"version": hopserve.__version__}
        )
        == 1
    )
    for stage in STAGES:
        metrics.observe_stage("m", stage, 0.001)
    with metrics.time_stage("m", "compute"):
        pass
    assert get("hopserve_stage_duration_seconds_count", {"model": "m", "stage": "compute"}) == 2
    with pytest.raises(ValueError, match="unknown stage"):
        metrics.observe_stage("m", "lunch", 1.0)
    metrics.set_worker_memory("w0", "cuda:0", used=1, total=10, peak=5)
    labels = {"worker": "w0", "device": "cuda:0", "kind": "peak"}
    assert get("hopserve_worker_device_memory_bytes", labels) == 5


def test_process_collectors_are_included() -> None:
    text = Metrics().expose().decode()
    assert "process_cpu_seconds_total" in text or "python_info" in text


def test_cache_observer_feeds_cache_metrics(unused_redis_url: str) -> None:
    metrics = Metrics(process_collectors=False)
    get = metrics.registry.get_sample_value
    ns = CacheNamespace("m", "1", "g", dim=2)

    async def scenario() -> None:
        memory = MemoryEmbeddingCache(10, observer=metrics.cache_observer())
        await memory.put_many(ns, np.array([1]), np.ones((1, 2)))
        await memory.get_many(ns, np.array([1, 2, 3]))
        redis_cache = RedisEmbeddingCache(unused_redis_url, observer=metrics.cache_observer())
        await redis_cache.get_many(ns, np.array([1, 2]))
        await redis_cache.close()

    asyncio.run(scenario())
    memory_labels = {"model": "m", "backend": "memory"}
    assert get("hopserve_cache_hits_total", memory_labels) == 1
    assert get("hopserve_cache_misses_total", memory_labels) == 2
    redis_labels = {"model": "m", "backend": "redis"}
    assert get("hopserve_cache_errors_total", redis_labels) == 1
    assert get("hopserve_cache_misses_total", redis_labels) == 2
    assert get("hopserve_cache_up", {"backend": "redis"}) == 0
    assert get("hopserve_cache_up", {"backend": "memory"}) == 1
