"""The soak's clients: the open-loop load generator (a process of its own) and the checker.

:func:`loadgen_entry` runs in a ``spawn``ed process: it measures the maximum throughput with
a closed loop, then sends Poisson (or fixed-rate) arrivals until told to stop, comparing
every served row with the reference, and leaves its request records in an ``.npz`` file.
:class:`Checker` (a thread of the orchestrator) compares served rows with a cache-bypass
recomputation and with the reference; its calls and the drain probes at shutdown are kept
by a :class:`Recorder`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from .common import CHECKER, MODEL, code_of
from .reference import RowChecker


def loadgen_entry(spec: dict[str, Any], out_q: Any, stop_ev: Any) -> None:
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
            code = code_of(err)
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


def call(
    client: Any, recorder: Recorder, source: int, nodes: np.ndarray, policy: str
) -> Any | None:
    """One synchronous GetEmbeddings; recorded; the result or ``None`` on failure."""
    start = time.monotonic()
    try:
        res = client.get_embeddings_with_info(MODEL, nodes, cache_policy=policy)
    except Exception as err:
        recorder.add(start, time.monotonic(), code_of(err), nodes.size, 0, 0, source)
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
                served = call(client, self.recorder, CHECKER, nodes, "use")
                bypass = call(client, self.recorder, CHECKER, nodes, "bypass")
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
