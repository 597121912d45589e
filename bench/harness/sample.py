"""Measuring: timings, percentiles, memory, and threads that sample processes and metrics.

* :func:`timed`, :func:`run_stats` — repeated wall-clock timings and their best/median;
  :func:`stage_seconds` — the evaluator's own stage timings;
* :func:`percentiles`; :func:`cached_lookups` — end-to-end latency of cache hits;
* :func:`peak_rss_mb`, :func:`current_rss_mb` — this process's memory;
* :class:`RssSampler` — a thread sampling RSS and CPU of named processes;
* :class:`MetricsScraper` — a thread scraping a Prometheus ``/metrics`` endpoint.
"""

from __future__ import annotations

import math
import os
import re
import resource
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Any, list[float]]:
    """Call ``fn`` ``repeat`` times; ``(last result, wall seconds of each call)``."""
    secs, out = [], None
    for _ in range(repeat):
        out = None  # free the previous result first: the peak RSS is one run's
        t0 = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t0)
    return out, secs


def run_stats(seconds: Sequence[float]) -> dict[str, Any]:
    """``seconds`` (best), ``runs_seconds`` (each, ms-rounded) and ``median_seconds`` (the
    upper median) of repeated runs."""
    return {
        "seconds": min(seconds),
        "runs_seconds": [round(v, 3) for v in seconds],
        "median_seconds": float(sorted(seconds)[len(seconds) // 2]),
    }


def stage_seconds(stats: Any, stages: Iterable[str]) -> dict[str, float]:
    """``{stage: seconds}`` (ms-rounded) of an evaluator's ``last_stats``."""
    return {k: round(getattr(stats, k), 3) for k in stages}


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``values`` (NaN when empty)."""
    import numpy as np

    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if arr.size == 0:
        return {f"p{q:g}": math.nan for q in qs}
    return {f"p{q:g}": float(np.percentile(arr, q)) for q in qs}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MB, ``getrusage``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    """Resident set size of this process now (MB, psutil)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


class RssSampler(threading.Thread):
    """Samples RSS and CPU time of named processes every ``interval`` seconds (daemon thread).

    Args:
        pids: Called at every sample; ``{name: pid or None}`` (so a restarted process is
            followed under its name).
        interval: Seconds between samples.

    ``samples`` holds ``(time.monotonic(), name, pid, rss bytes, cpu seconds)``;
    :meth:`series` gives one name's RSS, :meth:`cpu_percent` its CPU use between samples;
    ``host`` the whole machine's CPU use (100 per core) between samples — what else runs.
    """

    def __init__(self, pids: Callable[[], Mapping[str, int | None]], interval: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self._pids = pids
        self.interval = interval
        self.samples: list[tuple[float, str, int, int, float]] = []
        self.host: list[tuple[float, float]] = []  # (time, whole-machine CPU %, 100 per core)
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        import psutil

        ncpu = os.cpu_count() or 1
        psutil.cpu_percent(None)  # the first call only starts the interval
        while not self._stop_event.is_set():
            now = time.monotonic()
            with self._lock:
                self.host.append((now, psutil.cpu_percent(None) * ncpu))
            for name, pid in self._pids().items():
                if pid is None:
                    continue
                try:
                    proc = psutil.Process(pid)
                    with proc.oneshot():
                        rss = int(proc.memory_info().rss)
                        times = proc.cpu_times()
                except psutil.Error:
                    continue
                with self._lock:
                    self.samples.append((now, name, pid, rss, times.user + times.system))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling and join the thread."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)

    def _rows(self, name: str) -> list[tuple[float, str, int, int, float]]:
        with self._lock:
            return [row for row in self.samples if row[1] == name]

    def series(self, name: str) -> tuple[list[float], list[int]]:
        """``(times, rss bytes)`` of one process name."""
        rows = self._rows(name)
        return [r[0] for r in rows], [r[3] for r in rows]

    def cpu_percent(self, name: str) -> tuple[list[float], list[float]]:
        """``(times, CPU %)`` of one process name (100 = one core), between samples of
        the same pid (a restart starts a new series)."""
        rows = self._rows(name)
        times: list[float] = []
        values: list[float] = []
        for prev, cur in zip(rows, rows[1:], strict=False):
            if prev[2] == cur[2] and cur[0] > prev[0]:
                times.append(cur[0])
                values.append(100.0 * (cur[4] - prev[4]) / (cur[0] - prev[0]))
        return times, values

    def latest(self, name: str) -> int | None:
        """The most recent RSS sample of ``name``."""
        rows = self._rows(name)
        return rows[-1][3] if rows else None


class MetricsScraper(threading.Thread):
    """Scrapes a Prometheus ``/metrics`` endpoint every ``interval`` s (daemon thread).

    Args:
        url: e.g. ``http://127.0.0.1:9090/metrics``.
        interval: Seconds between scrapes.
        names: Sample names to keep (e.g. ``"hopserve_inflight_requests"``,
            ``"hopserve_requests_total"``).

    ``samples`` holds ``(time.monotonic(), {series key: value})`` where a key is
    ``name{label="value",...}`` (labels sorted); failed scrapes are skipped.
    """

    def __init__(self, url: str, interval: float, names: Iterable[str]) -> None:
        super().__init__(name="metrics-scraper", daemon=True)
        self.url = url
        self.interval = interval
        self.names = frozenset(names)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.failures = 0
        self._stop_event = threading.Event()

    @staticmethod
    def key(name: str, labels: Mapping[str, str]) -> str:
        """The series key of a sample."""
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}}"

    def scrape(self) -> dict[str, float]:
        """One scrape: the kept samples."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=max(1.0, self.interval)) as reply:
            text = reply.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in self.names:
                    out[self.key(sample.name, sample.labels)] = float(sample.value)
        return out

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.monotonic()
            try:
                values = self.scrape()
            except Exception:  # the process is down or busy: a gap in the series
                self.failures += 1
            else:
                self.samples.append((now, values))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        """Stop scraping and join the thread."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """``(times, values)`` of one series key (scrapes without it are skipped)."""
        rows = [(t, v[key]) for t, v in list(self.samples) if key in v]
        return [t for t, _ in rows], [x for _, x in rows]

    def matching(self, name: str, **labels: str) -> list[str]:
        """Series keys of ``name`` whose labels include ``labels``."""
        keys: set[str] = set()
        want = [f'{k}="{v}"' for k, v in labels.items()]
        for _, values in list(self.samples):
            for key in values:
                if key.startswith(name + "{") and all(w in key for w in want):
                    keys.add(key)
        return sorted(keys)

    def histogram_quantiles(
        self, name: str, t_from: float, t_to: float, qs: Sequence[float], **labels: str
    ) -> dict[str, float]:
        """Quantiles of histogram ``name`` (base name, no ``_bucket``) over the observations
        made between the scrapes around ``t_from`` and ``t_to``, summed over series matching
        ``labels``; linear within a bucket like PromQL's ``histogram_quantile`` (NaN when
        nothing was observed)."""
        counts: dict[float, float] = {}
        for key in self.matching(f"{name}_bucket", **labels):
            match = re.search(r'le="([^"]+)"', key)
            after = self.value_at(key, t_to)
            if match is None or after is None:
                continue
            le = float(match.group(1))
            counts[le] = counts.get(le, 0.0) + after - (self.value_at(key, t_from) or 0.0)
        bounds = sorted(counts)
        total = counts[bounds[-1]] if bounds else 0.0
        out: dict[str, float] = {}
        for q in qs:
            if total <= 0:
                out[f"p{q:g}"] = math.nan
                continue
            rank, lower, below = q / 100.0 * total, 0.0, 0.0
            value = math.nan
            for le in bounds:
                if counts[le] >= rank:
                    if math.isinf(le):
                        value = lower  # above the last finite bound: report that bound
                    else:
                        inside = counts[le] - below
                        value = lower + (le - lower) * ((rank - below) / inside if inside else 1)
                    break
                lower, below = le, counts[le]
            out[f"p{q:g}"] = value
        return out

    def value_at(self, key: str, t: float) -> float | None:
        """The last value of ``key`` scraped at or before ``t`` (``None`` if none)."""
        best = None
        for ts, values in list(self.samples):
            if ts > t:
                break
            if key in values:
                best = values[key]
        return best


async def cached_lookups(
    target: str, model: str, count: int, **client_options: Any
) -> dict[str, Any]:
    """p50/p99 (ms) of 16-node lookups that hit the cache, one request at a time.

    Warms the cache with 50 sets of 16 of the first 1,000 node ids, then times ``count``
    lookups cycling through them; ``client_options`` go to ``AsyncEmbeddingClient`` (TLS
    options, token).
    """
    import numpy as np

    from hopserve.client import AsyncEmbeddingClient

    rng = np.random.default_rng(5)
    async with AsyncEmbeddingClient(target, **client_options) as client:
        sets = [rng.choice(1000, 16, replace=False) for _ in range(50)]
        for s in sets:  # warm the cache
            await client.get_embeddings(model, s)
        lat = []
        for i in range(count):
            t = time.perf_counter()
            res = await client.get_embeddings_with_info(model, sets[i % len(sets)])
            lat.append(time.perf_counter() - t)
            assert res.cache_hits == 16
    pct = percentiles(np.asarray(lat) * 1e3, (50, 99))
    return {"p50_ms": pct["p50"], "p99_ms": pct["p99"], "requests": count}


def memory_model_mb(store_dir: str, num_nodes: int, hidden: int) -> dict[str, float]:
    """Graph + features (the store's arrays) + two layers of ``hidden``-wide float32 rows."""
    graph = sum(f.stat().st_size for f in Path(store_dir).glob("*.npy")) / 2**20
    emb = 2 * num_nodes * hidden * 4 / 2**20
    return {"graph_and_features": graph, "two_layers_of_embeddings": emb, "total": graph + emb}
