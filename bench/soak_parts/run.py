"""One soak run: the plan, what happened, and :class:`Soak`, which drives the processes,
the load generator, the checker and the phases.

One module (about 400 lines): the phase schedule and the fault injections read as one
timeline; the analysis, plot and report are in their own modules."""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import queue
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import RedisServer, ServiceProcess, free_port

from .common import (
    DRAIN,
    GRACE_S,
    MODEL,
    PHASE_FRACTIONS,
    REDIS_DOWN_FRACTION,
    SCRAPED,
    WORKER_DOWN_FRACTION,
    log,
)
from .load import Checker, Recorder, call, loadgen_entry
from .reference import RowChecker, compute_reference


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
        log(f"preparing data: {args.nodes:,} nodes, avg degree {args.avg_degree:g} …")
        self.data = harness.prepare_sage(
            Path(args.data), args.nodes, args.avg_degree, sparse_ids=True, seed=args.seed
        )
        self.ids, self.ref, self.reference_info = compute_reference(self.data)
        self.rows = RowChecker(self.ids, self.ref)
        np.save(self.work / "ids.npy", self.ids)
        np.save(self.work / "ref.npy", self.ref)
        log(f"reference: {self.reference_info}")

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
        log(f"redis on {self.redis.port}; starting worker on {self.worker_port} …")
        self.worker = harness.start_worker(
            self.config, self.worker_port, work / "worker.log", threads=args.worker_threads
        )
        stack.callback(self._stop_worker)
        log(f"starting front-end on {self.port} …")
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
            target=loadgen_entry, args=(spec, self._out_q, self._stop_ev), name="soak-loadgen"
        )
        self._loadgen.start()
        stack.callback(self._kill_loadgen)
        if args.rate is None:
            log(
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
            log(
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
        log(f"phase {name} (t={now - self.state.t0:.1f}s)")
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
        log(
            f"  t={t - self.state.t0:6.1f}s {phase:<9} sent {tally['sent']:>7} ok "
            f"{tally['ok']:>7} failed {tally['failed']:>5} shed {tally['shed']} in flight "
            f"{inflight:>3} wrong {tally['wrong']} | front-end RSS {rss / 2**20:.0f} MB | "
            f"checks {checks}"
        )

    def run_phases(self) -> None:
        """warmup → steady → redis → worker → steady-2 → shutdown."""
        plan, st = self.plan, self.state
        st.phases.append(("warmup", st.t0, math.inf))
        log(f"phase warmup (open loop {st.rate:.0f} QPS, {plan.total_s:.0f} s planned)")
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
                res = call(c, self.recorder, DRAIN, nodes, "bypass")
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
        log(f"front-end exited with {code} after {st.frontend_exit_s:.2f} s")
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
