"""Soak test: the real service under open-loop load while Redis, the worker and the front-end fail.

Starts a private ``redis-server`` (``hopserve.testing.RedisServer``, ``maxmemory`` with
``allkeys-lru``), one remote worker (``python -m hopserve worker``) and the front-end
(``python -m hopserve serve``, Redis cache, ``server.workers`` = that worker), then:

1. measures the maximum throughput with a short closed loop (``client/loadtest.py``,
   concurrency 32), in a load-generator process of its own;
2. drives the service OPEN loop from that process at ``--load-fraction`` (0.8) × max QPS:
   Poisson arrivals, Zipf popularity over the graph's real external IDs (read from the
   store's ``node_ids``; the graph is given sparse, non-contiguous IDs), log-normal set
   sizes. Every served row is compared with the reference;
3. runs the phases (fractions of ``--minutes``): ``warmup`` → ``steady`` → ``redis``
   (SIGKILL, restarted after a while) → ``worker`` (SIGKILL, restarted; the front-end keeps
   running) → ``steady-2`` → ``shutdown`` (SIGTERM to the front-end with requests in
   flight: it must drain them and exit 0).

Meanwhile a checker samples served rows (``cache_policy="use"``) and compares them with a
cache-bypass recomputation of the same IDs and with the model's own full-graph forward,
computed once here at start (and cross-checked against ``LayerwiseEvaluator.evaluate()``);
tolerance as ``tests/support.assert_exact``. The front-end's RSS is sampled with psutil.

Per phase: requests, errors by gRPC status, p50/p99 latency (from the scheduled arrival),
cache-hit ratio, front-end RSS at start/end, wrong rows; plus recovery times and the goals
(met / not met). Writes ``soak.json``, ``soak.md`` and ``soak.png`` (``soak-quick.*``
with ``--quick``) to ``--out``.

    python bench/soak.py                       # 10 minutes, 200K nodes -> bench/results/
    python bench/soak.py --minutes 3           # shorter
    python bench/soak.py --quick               # CI: ~40-60 s, 10K nodes -> a temp dir
    python bench/soak.py --quick --out /tmp/s  # ... to /tmp/s/soak-quick.{json,md,png}
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402 - bench/ is not a package
from harness import RedisServer, ServiceProcess, free_port, log  # noqa: E402

MODEL = "sage"
SOURCES = ("load", "checker", "drain")  # record "source" 0, 1, 2: who sent the request
LOAD, CHECKER, DRAIN = range(len(SOURCES))
GRACE_S = 10.0  # the front-end's server.grace_period_s (its default, written explicitly)
CLIENT_ERROR = -1  # record.code of a failure that is not a gRPC status

# Tolerance of tests/support.assert_exact: |got - want| <= RTOL·|want| + max(ATOL, ULPS·ε·scale),
# scale = max |reference| over the whole reference tensor, ε = float32 machine epsilon.
ATOL, RTOL, ULPS = 1e-5, 1e-4, 64
EPS32 = float(np.finfo(np.float32).eps)

# Phases as fractions of the run (the worker and shutdown phases stretch when a restart
# or the exit takes longer than planned).
PHASE_FRACTIONS = {
    "warmup": 0.06,
    "steady": 0.22,
    "redis": 0.20,
    "worker": 0.26,
    "steady-2": 0.22,
    "shutdown": 0.04,
}
REDIS_DOWN_FRACTION = 0.30  # of the redis phase
WORKER_DOWN_FRACTION = 0.15  # of the worker phase, before the restart is launched
RECOVERY_GOAL_S = 2.0
SCRAPED = (  # front-end /metrics series kept for the report and the plot
    "hopserve_inflight_requests",
    "hopserve_queue_depth",
    "hopserve_cache_up",
    "hopserve_worker_up",
    "hopserve_requests_total",
    "hopserve_cache_errors_total",
    "hopserve_worker_jobs_total",
    "hopserve_request_duration_seconds_bucket",
)
RSS_GOAL_PCT = 5.0


def _log(message: str) -> None:
    log(message, prefix="soak")


# =========================================================================== checking
class RowChecker:
    """Compares served rows with the reference (``assert_exact``'s tolerance), by external ID.

    Args:
        ids: External node IDs, row ``i`` of ``ref`` belongs to ``ids[i]``.
        ref: ``[N, d]`` float32 reference embeddings.
    """

    def __init__(self, ids: np.ndarray, ref: np.ndarray) -> None:
        order = np.argsort(ids, kind="stable")
        self.sorted_ids = np.ascontiguousarray(ids[order])
        self.ref = np.ascontiguousarray(ref[order]).astype(np.float64)
        finite = self.ref[np.isfinite(self.ref)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        self.floor = max(ATOL, ULPS * EPS32 * scale)

    def reference(self, nodes: np.ndarray) -> np.ndarray:
        """Reference rows of external IDs ``nodes`` (float64)."""
        return self.ref[np.searchsorted(self.sorted_ids, nodes)]

    def wrong_rows(self, got: np.ndarray, want: np.ndarray) -> int:
        """Rows of ``got`` with any element outside the tolerance around ``want``."""
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return int(want.shape[0])
        ok = np.abs(got - want) <= RTOL * np.abs(want) + self.floor  # NaN is never ok
        return int((~ok.all(axis=1)).sum())

    def wrong_vs_reference(self, nodes: np.ndarray, got: np.ndarray) -> int:
        """Rows of ``got`` (for ``nodes``) that differ from the reference."""
        return self.wrong_rows(got, self.reference(nodes))


def _code_of(err: BaseException) -> int:
    """The gRPC status number of a client error (``CLIENT_ERROR`` for anything else)."""
    code = getattr(err, "code", None)
    value = getattr(code, "value", None)
    return int(value[0]) if isinstance(value, tuple) else CLIENT_ERROR


def code_names() -> dict[int, str]:
    """Record code → name (``grpc.StatusCode`` names; ``CLIENT_ERROR`` for -1)."""
    import grpc

    names = {int(c.value[0]): c.name for c in grpc.StatusCode}
    names[CLIENT_ERROR] = "CLIENT_ERROR"
    return names


# =========================================================================== load generator
def _loadgen_entry(spec: dict[str, Any], out_q: Any, stop_ev: Any) -> None:
    """Entry point of the load-generator process (multiprocessing, spawn)."""
    import asyncio

    try:
        asyncio.run(_loadgen(spec, out_q, stop_ev))
    except BaseException as err:
        out_q.put(("failed", repr(err)))
        raise


async def _loadgen(spec: dict[str, Any], out_q: Any, stop_ev: Any) -> None:
    """Measure max QPS (closed loop) unless given, then run the open loop until stopped."""
    import asyncio

    from hopserve.client.aio import AsyncEmbeddingClient
    from hopserve.client.loadtest import LoadSpec, TargetSampler, run_load

    ids = np.load(spec["ids"])
    checker = RowChecker(ids, np.load(spec["ref"]))
    parent = os.getppid()
    target, timeout = spec["target"], spec["timeout_s"]
    shape = {
        "set_size": spec["set_size"],
        "set_size_sigma": spec["set_size_sigma"],
        "zipf_a": spec["zipf"],
        "node_ids": ids,
        "timeout_s": timeout,
    }
    rate = spec["rate"]
    if rate is None:
        measured = await run_load(
            target,
            LoadSpec(
                model=MODEL,
                concurrency=spec["measure_concurrency"],
                duration_s=spec["measure_s"],
                warmup_s=spec["measure_warmup_s"],
                seed=spec["seed"] + 100,
                **shape,
            ),
        )
        rate = spec["load_fraction"] * measured.qps
        out_q.put(("measured", measured.to_dict(), rate))
    if not rate or rate <= 0:
        raise RuntimeError(f"no usable request rate ({rate})")
    sampler = TargetSampler(ids, LoadSpec(model=MODEL, seed=spec["seed"], **shape))
    rng = np.random.default_rng(spec["seed"] + 7)
    cols: dict[str, list[float]] = {
        k: [] for k in ("sched", "start", "end", "code", "n", "hits", "wrong")
    }
    tally = {"sent": 0, "ok": 0, "failed": 0, "shed": 0, "wrong": 0}
    inflight: set[asyncio.Task[None]] = set()

    async def one(client: AsyncEmbeddingClient, nodes: np.ndarray, sched: float) -> None:
        start = time.monotonic()
        hits = wrong = 0
        try:
            res = await client.get_embeddings_with_info(MODEL, nodes)
            code = 0
            hits = res.cache_hits
            wrong = checker.wrong_vs_reference(nodes, res.embeddings)
        except Exception as err:  # HopserveError (status) or anything unexpected
            code = _code_of(err)
        end = time.monotonic()
        for key, value in (
            ("sched", sched),
            ("start", start),
            ("end", end),
            ("code", code),
            ("n", nodes.size),
            ("hits", hits),
            ("wrong", wrong),
        ):
            cols[key].append(value)
        tally["ok" if code == 0 else "failed"] += 1
        tally["wrong"] += wrong

    async with AsyncEmbeddingClient(target, timeout=timeout, max_retries=0) as client:
        await client.get_model(MODEL)  # connect before the clock starts
        t0 = time.monotonic()
        out_q.put(("started", t0, rate))
        next_at, next_report = t0, t0 + 1.0
        poisson = spec["arrivals"] == "poisson"
        while not stop_ev.is_set() and os.getppid() == parent:
            next_at += rng.exponential(1.0 / rate) if poisson else 1.0 / rate
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(inflight) >= spec["max_inflight"]:
                tally["shed"] += 1
                continue
            task = asyncio.get_running_loop().create_task(one(client, sampler.draw(), next_at))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            tally["sent"] += 1
            if (now := time.monotonic()) >= next_report:
                out_q.put(("progress", now, dict(tally), len(inflight)))
                next_report = now + 1.0
        if inflight:
            await asyncio.wait(set(inflight), timeout=timeout + 5)
    arrays = {
        k: np.asarray(v, dtype=np.int64 if k in ("code", "n", "hits", "wrong") else np.float64)
        for k, v in cols.items()
    }
    np.savez(spec["records"], **arrays)
    out_q.put(("done", dict(tally)))


# =========================================================================== checker
class Recorder:
    """Thread-safe request records of the orchestrator's own calls (checker, drain)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[float, float, float, int, int, int, int, int]] = []

    def add(
        self, start: float, end: float, code: int, n: int, hits: int, wrong: int, source: int
    ) -> None:
        with self._lock:
            self.rows.append((start, start, end, code, n, hits, wrong, source))


def _call(
    client: Any, recorder: Recorder, source: int, nodes: np.ndarray, policy: str
) -> Any | None:
    """One synchronous GetEmbeddings; recorded; the result or ``None`` on failure."""
    start = time.monotonic()
    try:
        res = client.get_embeddings_with_info(MODEL, nodes, cache_policy=policy)
    except Exception as err:
        recorder.add(start, time.monotonic(), _code_of(err), nodes.size, 0, 0, source)
        return None
    recorder.add(start, time.monotonic(), 0, nodes.size, res.cache_hits, 0, source)
    return res


class Checker(threading.Thread):
    """Every ``interval`` s: served rows (cache ``use``) vs bypass recomputation vs reference."""

    def __init__(
        self,
        target: str,
        ids: np.ndarray,
        rows: RowChecker,
        recorder: Recorder,
        *,
        interval: float,
        set_size: int,
        zipf: float,
        seed: int,
    ) -> None:
        super().__init__(name="soak-checker", daemon=True)
        self.target, self.ids, self.rows, self.recorder = target, ids, rows, recorder
        self.interval, self.set_size, self.zipf, self.seed = interval, set_size, zipf, seed
        self.stop_event = threading.Event()
        self.stats = {
            "samples": 0,
            "rows_compared": 0,
            "served_vs_reference": 0,
            "bypass_vs_reference": 0,
            "served_vs_bypass": 0,
            "failed_calls": 0,
        }
        self.bad: list[dict[str, Any]] = []  # first few wrong samples, for the report

    def run(self) -> None:
        from hopserve.client import EmbeddingClient
        from hopserve.client.loadtest import LoadSpec, TargetSampler

        sampler = TargetSampler(
            self.ids,
            LoadSpec(model=MODEL, set_size=self.set_size, zipf_a=self.zipf, seed=self.seed),
        )
        with EmbeddingClient(self.target, timeout=5.0, max_retries=0) as client:
            while not self.stop_event.wait(self.interval):
                nodes = np.unique(sampler.draw())
                served = _call(client, self.recorder, CHECKER, nodes, "use")
                bypass = _call(client, self.recorder, CHECKER, nodes, "bypass")
                self.stats["failed_calls"] += (served is None) + (bypass is None)
                if served is None or bypass is None:
                    continue
                want = self.rows.reference(nodes)
                wrong = {
                    "served_vs_reference": self.rows.wrong_rows(served.embeddings, want),
                    "bypass_vs_reference": self.rows.wrong_rows(bypass.embeddings, want),
                    "served_vs_bypass": self.rows.wrong_rows(served.embeddings, bypass.embeddings),
                }
                self.stats["samples"] += 1
                self.stats["rows_compared"] += nodes.size
                for key, count in wrong.items():
                    self.stats[key] += count
                if any(wrong.values()) and len(self.bad) < 5:
                    self.bad.append(
                        {"t": time.monotonic(), **wrong, "cache_hits": served.cache_hits}
                    )

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=15)


# =========================================================================== orchestration
@dataclass
class Plan:
    """Phase lengths (seconds) of one run."""

    total_s: float
    phases: dict[str, float]
    redis_down_s: float
    worker_down_s: float
    worker_tail_s: float  # at least this long after the worker is SERVING again
    exit_tail_s: float  # load continues this long after the front-end exited

    @classmethod
    def for_minutes(cls, minutes: float) -> Plan:
        total = minutes * 60.0
        phases = {name: frac * total for name, frac in PHASE_FRACTIONS.items()}
        return cls(
            total_s=total,
            phases=phases,
            redis_down_s=REDIS_DOWN_FRACTION * phases["redis"],
            worker_down_s=WORKER_DOWN_FRACTION * phases["worker"],
            worker_tail_s=max(3.0, 0.1 * phases["worker"]),
            exit_tail_s=min(3.0, max(1.0, phases["shutdown"])),
        )


@dataclass
class RunState:
    """What happened, in ``time.monotonic()`` seconds."""

    t0: float = 0.0  # open loop start
    rate: float = 0.0
    measured: dict[str, Any] = field(default_factory=dict)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    wall_offset: float = field(default_factory=lambda: time.time() - time.monotonic())
    frontend_exit_code: int | None = None
    frontend_exit_s: float | None = None
    worker_exit_code: int | None = None
    loadgen_tally: dict[str, int] = field(default_factory=dict)
    progress: tuple[float, dict[str, int], int] | None = None

    def event(self, name: str, label: str | None = None) -> float:
        now = time.monotonic()
        self.marks[name] = now
        self.events.append((now, label or name))
        return now


class Soak:
    """One soak run: processes, load generator, checker, phases; then :meth:`analyze`."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.plan = Plan.for_minutes(args.minutes)
        self.state = RunState()
        self.recorder = Recorder()
        self.frontend: ServiceProcess | None = None
        self.worker: ServiceProcess | None = None
        self.redis: RedisServer | None = None
        self.rss: harness.RssSampler | None = None
        self.metrics: harness.MetricsScraper | None = None
        self.checker: Checker | None = None
        self._loadgen: Any = None
        self._out_q: Any = None
        self._stop_ev: Any = None
        self._last_log = 0.0

    # ------------------------------------------------------------------ set-up
    def prepare(self) -> None:
        """Graph, weights, reference rows (model's own forward), ids.npy / ref.npy."""
        args = self.args
        _log(f"preparing data: {args.nodes:,} nodes, avg degree {args.avg_degree:g} …")
        self.data = harness.prepare_sage(
            Path(args.data), args.nodes, args.avg_degree, sparse_ids=True, seed=args.seed
        )
        self.ids, self.ref, self.reference_info = compute_reference(self.data)
        self.rows = RowChecker(self.ids, self.ref)
        np.save(self.work / "ids.npy", self.ids)
        np.save(self.work / "ref.npy", self.ref)
        _log(f"reference: {self.reference_info}")

    def start_services(self, stack: contextlib.ExitStack) -> None:
        """Redis, worker, front-end; RSS/CPU sampler and /metrics scraper."""
        args, work = self.args, self.work
        self.redis = RedisServer.launch(work / "redis", maxmemory=args.redis_maxmemory)
        stack.callback(self.redis.stop)
        self.worker_port, self.port, metrics_port = free_port(), free_port(), free_port()
        self.config = harness.write_config(
            work / "hopserve.yaml",
            [harness.model_entry(MODEL, self.data)],
            server={
                "port": self.port,
                "metrics_port": metrics_port,
                "workers": [f"127.0.0.1:{self.worker_port}"],
                "grace_period_s": GRACE_S,
            },
            cache={"backend": "redis", "redis_url": self.redis.url, "ttl_s": 3600},
        )
        _log(f"redis on {self.redis.port}; starting worker on {self.worker_port} …")
        self.worker = harness.start_worker(
            self.config, self.worker_port, work / "worker.log", threads=args.worker_threads
        )
        stack.callback(self._stop_worker)
        _log(f"starting front-end on {self.port} …")
        self.frontend = harness.start_frontend(
            self.config, self.port, work / "frontend.log", model=MODEL
        )
        stack.callback(self.frontend.kill)
        self.rss = harness.RssSampler(
            lambda: {
                "front-end": _pid(self.frontend),
                "worker": _pid(self.worker),
                "load generator": self._loadgen.pid if self._loadgen is not None else None,
            },
            interval=args.rss_interval,
        )
        self.rss.start()
        stack.callback(self.rss.stop)
        self.metrics = harness.MetricsScraper(
            f"http://127.0.0.1:{metrics_port}/metrics", args.rss_interval, SCRAPED
        )
        self.metrics.start()
        stack.callback(self.metrics.stop)

    def _stop_worker(self) -> None:
        if self.worker is not None and self.worker.alive:
            code, _ = self.worker.terminate(timeout=20)
            self.state.worker_exit_code = code

    def start_load(self, stack: contextlib.ExitStack) -> None:
        """Spawn the load generator; wait for its max-QPS measurement and open-loop start."""
        args = self.args
        ctx = mp.get_context("spawn")
        self._out_q, self._stop_ev = ctx.Queue(), ctx.Event()
        spec = {
            "target": f"127.0.0.1:{self.port}",
            "ids": str(self.work / "ids.npy"),
            "ref": str(self.work / "ref.npy"),
            "records": str(self.work / "records.npz"),
            "rate": args.rate,
            "load_fraction": args.load_fraction,
            "measure_concurrency": args.measure_concurrency,
            "measure_s": args.measure_s,
            "measure_warmup_s": args.measure_warmup_s,
            "set_size": args.set_size,
            "set_size_sigma": args.set_size_sigma,
            "zipf": args.zipf,
            "arrivals": args.arrivals,
            "timeout_s": args.timeout,
            "max_inflight": args.max_inflight,
            "seed": args.seed,
        }
        self._loadgen = ctx.Process(
            target=_loadgen_entry, args=(spec, self._out_q, self._stop_ev), name="soak-loadgen"
        )
        self._loadgen.start()
        stack.callback(self._kill_loadgen)
        if args.rate is None:
            _log(
                f"measuring max throughput: closed loop, concurrency {args.measure_concurrency},"
                f" {args.measure_s:g} s (+{args.measure_warmup_s:g} s warm-up) …"
            )
        deadline = time.monotonic() + args.measure_s + args.measure_warmup_s + 120
        while not self.state.t0:
            self._pump(timeout=0.5)
            if not self._loadgen.is_alive() and not self.state.t0:
                raise RuntimeError(f"load generator exited ({self._loadgen.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError("load generator did not start")
        m = self.state.measured
        if m:
            _log(
                f"max throughput {m['qps']:.0f} QPS (p50 {m['p50_ms']:.1f} ms, p99 "
                f"{m['p99_ms']:.1f} ms, errors {m['errors'] or 0}); open loop at "
                f"{self.state.rate:.0f} QPS"
            )

    def _kill_loadgen(self) -> None:
        if self._loadgen is not None and self._loadgen.is_alive():
            self._stop_ev.set()
            self._loadgen.join(timeout=30)
            if self._loadgen.is_alive():
                self._loadgen.kill()
                self._loadgen.join(timeout=5)

    def _pump(self, timeout: float = 0.0) -> None:
        """Handle the load generator's messages."""
        try:
            msg = self._out_q.get(timeout=timeout) if timeout else self._out_q.get_nowait()
        except queue.Empty:
            return
        while True:
            kind = msg[0]
            if kind == "measured":
                self.state.measured, self.state.rate = msg[1], msg[2]
            elif kind == "started":
                self.state.t0, self.state.rate = msg[1], msg[2]
            elif kind == "progress":
                self.state.progress = (msg[1], msg[2], msg[3])
            elif kind == "done":
                self.state.loadgen_tally = msg[1]
            elif kind == "failed":
                raise RuntimeError(f"load generator failed: {msg[1]}")
            try:
                msg = self._out_q.get_nowait()
            except queue.Empty:
                return

    # ------------------------------------------------------------------ phases
    def _phase(self, name: str) -> float:
        """End the current phase and start ``name`` now; returns its start."""
        now = self._end_phase()
        self.state.phases.append((name, now, math.inf))
        _log(f"phase {name} (t={now - self.state.t0:.1f}s)")
        return now

    def _end_phase(self) -> float:
        """Close the current phase (if any) now; returns now."""
        now = time.monotonic()
        if self.state.phases:
            name, start, _ = self.state.phases[-1]
            self.state.phases[-1] = (name, start, now)
        return now

    def _wait_until(self, until: float, phase: str) -> None:
        """Sleep until ``until`` (monotonic), pumping messages and logging progress."""
        while (now := time.monotonic()) < until:
            self._pump(timeout=min(0.2, max(0.01, until - now)))
            if now - self._last_log >= self.args.progress_every:
                self._last_log = now
                self._progress_line(phase)
        self._pump()

    def _progress_line(self, phase: str) -> None:
        if self.state.progress is None:
            return
        t, tally, inflight = self.state.progress
        rss = (self.rss.latest("front-end") if self.rss else None) or 0
        checks = self.checker.stats["samples"] if self.checker else 0
        _log(
            f"  t={t - self.state.t0:6.1f}s {phase:<9} sent {tally['sent']:>7} ok "
            f"{tally['ok']:>7} failed {tally['failed']:>5} shed {tally['shed']} in flight "
            f"{inflight:>3} wrong {tally['wrong']} | front-end RSS {rss / 2**20:.0f} MB | "
            f"checks {checks}"
        )

    def run_phases(self) -> None:
        """warmup → steady → redis → worker → steady-2 → shutdown."""
        plan, st = self.plan, self.state
        st.phases.append(("warmup", st.t0, math.inf))
        _log(f"phase warmup (open loop {st.rate:.0f} QPS, {plan.total_s:.0f} s planned)")
        self.checker = Checker(
            f"127.0.0.1:{self.port}",
            self.ids,
            self.rows,
            self.recorder,
            interval=self.args.check_interval,
            set_size=32,
            zipf=self.args.zipf,
            seed=self.args.seed + 11,
        )
        self.checker.start()
        self._wait_until(st.t0 + plan.phases["warmup"], "warmup")

        start = self._phase("steady")
        self._wait_until(start + plan.phases["steady"], "steady")

        start = self._phase("redis")
        assert self.redis is not None
        st.event("redis_kill", "Redis SIGKILL")
        self.redis.stop()
        self._wait_until(start + plan.redis_down_s, "redis")
        self.redis.start()
        st.event("redis_back", "Redis back")
        self._wait_until(start + plan.phases["redis"], "redis")

        start = self._phase("worker")
        assert self.worker is not None
        st.event("worker_kill", "worker SIGKILL")
        self.worker.kill()
        self._wait_until(start + plan.worker_down_s, "worker")
        st.event("worker_start", "worker restart")
        self.worker.start()
        target = f"127.0.0.1:{self.worker_port}"
        while harness.grpc_health(target, "", timeout=0.5) != "SERVING":
            if not self.worker.alive:
                raise RuntimeError(f"worker exited on restart:\n{self.worker.log_tail()}")
            self._wait_until(time.monotonic() + 0.05, "worker")
        st.event("worker_serving", "worker SERVING")
        end = max(start + plan.phases["worker"], st.marks["worker_serving"] + plan.worker_tail_s)
        self._wait_until(end, "worker")

        start = self._phase("steady-2")
        self._wait_until(start + plan.phases["steady-2"], "steady-2")

        self._phase("shutdown")
        self._shutdown()

    def _shutdown(self) -> None:
        """Large bypass requests in flight, SIGTERM, wait for the exit, stop the load."""
        st, args = self.state, self.args
        assert self.frontend is not None
        rng = np.random.default_rng(args.seed + 13)
        size = min(args.drain_set_size, self.ids.size)
        sets = [rng.choice(self.ids, size=size, replace=False) for _ in range(args.drain_probes)]
        results: list[Any] = []

        def probe(nodes: np.ndarray) -> None:
            from hopserve.client import EmbeddingClient

            with EmbeddingClient(f"127.0.0.1:{self.port}", timeout=30, max_retries=0) as c:
                try:
                    c.get_model(MODEL)  # connected before the clock
                finally:
                    barrier.wait(timeout=30)
                res = _call(c, self.recorder, DRAIN, nodes, "bypass")
                if res is not None:
                    results.append((nodes, res.embeddings))

        barrier = threading.Barrier(len(sets) + 1)
        with ThreadPoolExecutor(len(sets)) as pool:
            for nodes in sets:
                pool.submit(probe, nodes)
            barrier.wait(timeout=30)
            time.sleep(args.sigterm_delay)
            st.event("sigterm", "front-end SIGTERM")
            self.frontend.signal(signal.SIGTERM)
            limit = GRACE_S + 20.0  # beyond the grace period: hung, killed, exit code None
            while self.frontend.alive and time.monotonic() - st.marks["sigterm"] < limit:
                self._wait_until(time.monotonic() + 0.05, "shutdown")
            code, _ = self.frontend.wait(timeout=0)
            st.frontend_exit_code = code
            st.event("frontend_exit", f"front-end exit ({code})")
            st.frontend_exit_s = st.marks["frontend_exit"] - st.marks["sigterm"]
        self.drain_wrong = sum(self.rows.wrong_vs_reference(n, e) for n, e in results)
        _log(f"front-end exited with {code} after {st.frontend_exit_s:.2f} s")
        self._wait_until(time.monotonic() + self.plan.exit_tail_s, "shutdown")
        self._end_phase()
        if self.checker is not None:
            self.checker.stop()
        self._stop_ev.set()
        deadline = time.monotonic() + args.timeout + 30
        while not st.loadgen_tally and time.monotonic() < deadline:
            self._pump(timeout=0.5)
        self._loadgen.join(timeout=10)
        if not st.loadgen_tally:
            raise RuntimeError("the load generator did not report its records")

    # ------------------------------------------------------------------ results
    def records(self) -> dict[str, np.ndarray]:
        """Every request: sched/start/end (monotonic), code, n, hits, wrong, source."""
        with np.load(self.work / "records.npz") as z:
            load = {k: z[k] for k in z.files}
        load["source"] = np.zeros(load["code"].size, dtype=np.int64)
        own = np.asarray(self.recorder.rows, dtype=np.float64).reshape(-1, 8)
        keys = ("sched", "start", "end", "code", "n", "hits", "wrong", "source")
        out = {}
        for i, key in enumerate(keys):
            col = own[:, i].astype(load[key].dtype if key in load else np.int64)
            out[key] = np.concatenate([load[key], col])
        order = np.argsort(out["start"], kind="stable")
        return {k: v[order] for k, v in out.items()}


def _pid(proc: ServiceProcess | None) -> int | None:
    return proc.pid if proc is not None and proc.alive else None


def compute_reference(data: harness.SageData) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The model's own full-graph forward: ``(external ids, rows [N, d] float32, info)``.

    Runs ``GraphSAGE.forward(x, edge_index)`` on the whole stored graph (storage order) and
    cross-checks it against ``LayerwiseEvaluator(model, store).evaluate()``.
    """
    import torch

    from hopserve import GraphStore, LayerwiseEvaluator
    from hopserve.examples import GraphSAGE

    store = GraphStore.open(data.graph)
    model = GraphSAGE(**data.kwargs)
    model.load_state_dict(torch.load(data.weights, weights_only=True))
    model.eval()
    t = time.perf_counter()
    dst = torch.repeat_interleave(torch.arange(store.num_nodes), store.in_degrees)
    edge_index = torch.stack([store.indices.long(), dst])
    with torch.no_grad():
        ref = model(store.features.float(), edge_index).numpy().astype(np.float32)
    forward_s = time.perf_counter() - t
    ids = store.to_external(np.arange(store.num_nodes)).numpy().astype(np.int64)
    t = time.perf_counter()
    with torch.no_grad():
        engine = LayerwiseEvaluator(model, store).evaluate().numpy()  # ascending external ID
    engine_s = time.perf_counter() - t
    order = np.argsort(ids)
    rows = RowChecker(ids, ref)
    info = {
        "nodes": store.num_nodes,
        "edges": store.num_edges,
        "external_ids": f"sparse, {int(ids.min())}..{int(ids.max())}",
        "forward_s": round(forward_s, 3),
        "engine_s": round(engine_s, 3),
        "engine_vs_forward_max_abs": float(np.abs(engine - ref[order]).max()),
        "engine_vs_forward_wrong_rows": rows.wrong_rows(engine, ref[order]),
        "tolerance_floor": rows.floor,
    }
    return ids, ref, info


# =========================================================================== analysis
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
            _fmt_codes(by_code(outside)) or "none",
        ),
        _goal(
            "errors in the worker-down window: UNAVAILABLE only",
            not window_non_unavailable,
            _fmt_codes(worker["errors_in_window"]) or "no errors",
        ),
        _goal(
            f"worker recovery ≤ {RECOVERY_GOAL_S:g} s after SERVING",
            rec_first is not None
            and rec_first <= RECOVERY_GOAL_S
            and worker["recovery_error_free_s"] <= RECOVERY_GOAL_S,
            f"first OK needing the worker +{_num(rec_first, '.2f')} s; error rate 0 after "
            f"+{worker['recovery_error_free_s']:.2f} s",
        ),
        _goal(
            f"RSS growth < {RSS_GOAL_PCT:g}% after warm-up",
            rss["growth_pct"] is not None and rss["growth_pct"] < RSS_GOAL_PCT,
            f"{_num(rss['baseline_mb'], '.0f')} → {_num(rss['final_mb'], '.0f')} MB "
            f"({_num(rss['growth_pct'], '+.1f')}%)",
        ),
        _goal(
            "clean exit: code 0, in-flight requests drained (OK or UNAVAILABLE only)",
            st.frontend_exit_code == 0 and not inflight_bad and shutdown["inflight_at_sigterm"] > 0,
            f"exit {st.frontend_exit_code} after {_num(st.frontend_exit_s, '.2f')} s; "
            f"{shutdown['inflight_at_sigterm']} in flight: "
            f"{_fmt_codes(shutdown['inflight_outcomes'])}",
        ),
        _goal(
            "(extra) Redis recovery ≤ 2 s: first cache hit after Redis is back",
            redis["recovery_first_hit_s"] is not None
            and redis["recovery_first_hit_s"] <= RECOVERY_GOAL_S,
            f"+{_num(redis['recovery_first_hit_s'], '.2f')} s",
        ),
        _goal(
            "(extra) new requests after SIGTERM: UNAVAILABLE only",
            not new_bad,
            _fmt_codes(shutdown["new_after_sigterm"]) or "none",
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


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _fmt_codes(codes: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(codes.items()))


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


# =========================================================================== outputs
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
                _fmt_codes(p["errors"]) or "-",
                _fmt_codes({k: v for k, v in p["server_outcomes"].items() if k != "ok"}) or "-",
                f"{p['qps_ok']:.0f}",
                _num(p["p50_ms"], ".1f"),
                _num(p["p99_ms"], ".1f"),
                _num(p["server_ms"]["p99"], ".0f"),
                _num(p["cache_hit_pct"], ".0f"),
                _num(p["rss_start_mb"], ".0f"),
                _num(p["rss_end_mb"], ".0f"),
                _num(p["rss_growth_pct"], "+.1f"),
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
        f"{_fmt_codes(r['errors_while_down']) or 'none'}. First cache hit "
        f"{_num(r['recovery_first_hit_s'], '.2f')} s after Redis was back.",
        f"* **Worker** SIGKILL at {w['killed_at_s']:.1f} s, restarted at {w['restarted_at_s']:.1f}"
        f" s, SERVING at {w['serving_at_s']:.1f} s (boot {w['boot_s']:.1f} s). First successful "
        f"request that needed the worker {_num(w['recovery_first_ok_s'], '.2f')} s after "
        f"SERVING; error rate back to 0 after {w['recovery_error_free_s']:.2f} s. Window "
        f"{w['window_s']:.1f} s: errors {_fmt_codes(w['errors_in_window']) or 'none'} "
        f"(error latency p50 {_num(w['error_latency_ms']['p50'], '.1f')} ms, p99 "
        f"{_num(w['error_latency_ms']['p99'], '.1f')} ms; {w['errors_after_serving']} of them "
        f"sent after SERVING; the front-end counted "
        f"{_fmt_codes(w['server_outcomes_in_window']) or '-'}); {w['ok_in_window']} requests "
        "succeeded in the window, "
        f"{w['ok_in_window_fully_cached']} of them entirely from the cache.",
        f"* **Shutdown** SIGTERM at {sd['sigterm_at_s']:.1f} s; exit code {sd['exit_code']} after "
        f"{_num(sd['exit_s'], '.2f')} s. In flight at SIGTERM: {sd['inflight_at_sigterm']} "
        f"({_fmt_codes(sd['inflight_outcomes']) or '-'}; the large bypass drain probes: "
        f"{_fmt_codes(sd['inflight_drain_probes']) or '-'}). New requests after SIGTERM: "
        f"{_fmt_codes(sd['new_after_sigterm']) or 'none'} (before the exit: "
        f"{_fmt_codes(sd['new_after_sigterm_before_exit']) or 'none'}).",
        f"* **RSS** (front-end) {rss['measured']}: {_num(rss['baseline_mb'], '.0f')} → "
        f"{_num(rss['final_mb'], '.0f')} MB ({_num(rss['growth_pct'], '+.1f')}%), peak "
        f"{_num(rss['peak_mb'], '.0f')} MB.",
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
                    _md_escape(w["example"]),
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
        f"{m['p99_ms']:.1f} ms, errors {_fmt_codes(m['errors']) or 'none'}; the soak offers "
        f"{load['load_fraction']:g} × that. Load-generator schedule lag p99: "
        f"{_num(load['schedule_lag_p99_ms'], '.1f')} ms; requests shed by the generator: "
        f"{load['tally'].get('shed', 0)}."
    )


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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# =========================================================================== main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI mode: 10K nodes, ~40-60 s, short phases, output to a temp dir",
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="planned open-loop duration (default 10; 0.6 with --quick)",
    )
    p.add_argument("--nodes", type=int, default=None, help="graph nodes (200K; 10K quick)")
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open-loop QPS (default: load fraction × measured max)",
    )
    p.add_argument("--load-fraction", type=float, default=0.8)
    p.add_argument("--measure-s", type=float, default=None, help="closed-loop measurement (s)")
    p.add_argument("--measure-warmup-s", type=float, default=None)
    p.add_argument("--measure-concurrency", type=int, default=32)
    p.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--set-size", type=int, default=16)
    p.add_argument("--set-size-sigma", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=10.0, help="client deadline per request (s)")
    p.add_argument(
        "--max-inflight",
        type=int,
        default=2000,
        help="open-loop requests outstanding at most (more are shed and counted)",
    )
    p.add_argument("--check-interval", type=float, default=None, help="checker period (s)")
    p.add_argument(
        "--drain-probes", type=int, default=4, help="large bypass requests sent just before SIGTERM"
    )
    p.add_argument("--drain-set-size", type=int, default=2048)
    p.add_argument(
        "--sigterm-delay",
        type=float,
        default=0.02,
        help="seconds between sending the drain probes and SIGTERM",
    )
    p.add_argument("--redis-maxmemory", default=None, help="(64mb; 16mb quick)")
    p.add_argument("--worker-threads", type=int, default=None)
    p.add_argument("--rss-interval", type=float, default=None)
    p.add_argument("--progress-every", type=float, default=None, help="progress line period")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="graph/weights cache (data/; quick: temp)")
    p.add_argument("--out", default=None, help="output folder (bench/results; quick: temp)")
    p.add_argument("--keep-work", action="store_true", help="keep the work dir (logs, records)")
    args = p.parse_args(argv)
    q = args.quick
    defaults = {
        "minutes": 0.6 if q else 10.0,
        "nodes": 10_000 if q else 200_000,
        "measure_s": 4.0 if q else 15.0,
        "measure_warmup_s": 1.0 if q else 3.0,
        "check_interval": 0.25 if q else 0.5,
        "redis_maxmemory": "16mb" if q else "64mb",
        "rss_interval": 0.25 if q else 1.0,
        "progress_every": 5.0 if q else 15.0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prefix = "soak-quick" if args.quick else "soak"

    def on_sigterm(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # runs the clean-up below

    signal.signal(signal.SIGTERM, on_sigterm)
    work = Path(tempfile.mkdtemp(prefix="hopserve-soak-"))
    if args.out is not None:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="hopserve-soak-quick-"))
    else:
        out = harness.RESULTS
    if args.data is None:
        args.data = str(work / "data") if args.quick else str(harness.REPO / "data")
    started = time.monotonic()
    soak = Soak(args, work)
    try:
        with contextlib.ExitStack() as stack:
            soak.prepare()
            soak.start_services(stack)
            soak.start_load(stack)
            soak.run_phases()
        summary = analyze(soak)
    finally:
        if args.keep_work:
            _log(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    harness.write_json(out / f"{prefix}.json", summary)
    lines = markdown(summary, f"{prefix}.png")
    harness.write_lines(out / f"{prefix}.md", lines)
    plot(out / f"{prefix}.png", summary)
    print("\n".join(lines))
    _log(
        f"wrote {out / prefix}.{{json,md,png}} in {summary['wall_s']:.0f} s; goals "
        f"{'met' if summary['goals_met'] else 'NOT met'}"
    )
    for goal in summary["goals"]:
        _log(f"  [{'met' if goal['met'] else 'NOT MET'}] {goal['goal']}: {goal['measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
