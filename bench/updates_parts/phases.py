"""One measured phase against a running service, and the one-off measurements.

A phase replays the query stream open loop (every request at its scheduled instant, latency
counted from that instant) while, unless it is ``idle``, an updater sends edge mutations:

* at a fixed rate: every ``batch_interval`` seconds one batch with the mutations due since
  the last one (a slow acknowledgement makes the next batch larger, the rate holds);
* ``max``: batches of ``max_batch`` mutations back to back (one in flight), the sustained
  throughput.

One batch in flight at a time: the service applies batches one after the other (one log
fsync each), so a second one would only wait. After each acknowledgement the checker asks for
the batch's probe node (:mod:`.streams`) with the cache on: the answer must be at the
batch's sequence or later (read-your-writes), and every ``check_every``-th time it is
compared with a cache-bypass recomputation at the same sequence. The checker always takes
the latest acknowledged batch (older ones it had no time for are counted as superseded).
After the phase, with no update in flight, a *quiet check* compares cached answers with
recomputations for the probes, a sample of the hot keys and the last batch's destinations.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import harness
import numpy as np

from .service import Service, metric_total
from .streams import MODELS, GraphView, Probe, Request, UpdateSource

# Tolerance of tests/support.assert_exact (as bench/soak_parts/reference.py).
ATOL, RTOL, ULPS = 1e-5, 1e-4, 64
EPS32 = float(np.finfo(np.float32).eps)
SCRAPED = (
    "hopserve_graph_update_duration_seconds_sum",
    "hopserve_graph_update_duration_seconds_count",
    "hopserve_worker_jobs_total",
)


def log(message: str) -> None:
    """A progress line on stderr, ``[updates +12.3s] ...``."""
    harness.log(message, prefix="updates")


def wrong_rows(got: np.ndarray, want: np.ndarray) -> int:
    """Rows of ``got`` outside ``assert_exact``'s tolerance around ``want``."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return int(want.shape[0])
    finite = want[np.isfinite(want)]
    floor = max(ATOL, ULPS * EPS32 * (float(np.abs(finite).max()) if finite.size else 0.0))
    ok = np.abs(got - want) <= RTOL * np.abs(want) + floor
    return int((~ok.all(axis=1)).sum())


def pct(values: Any, qs: tuple[float, ...] = (50, 99)) -> dict[str, float]:
    """``{"p50": ..., "p99": ...}`` (NaN when empty)."""
    return harness.percentiles(np.asarray(values, dtype=float), qs)


@dataclass(frozen=True)
class PhaseSpec:
    """A phase: its name, update rate (mutations/s; 0 = none, ``inf`` = as fast as the
    service acknowledges) and the seconds between batches at a fixed rate."""

    name: str
    rate: float
    interval: float = 0.1


@dataclass
class Context:
    """What the phases of one configuration share."""

    config: str
    service: Service
    emb: Any  # AsyncEmbeddingClient
    admin: Any  # AsyncAdminClient
    view: GraphView
    stream: list[Request]
    hot: np.ndarray
    probes: list[Probe]
    source: UpdateSource
    cached: bool
    duration: float
    timeout: float
    max_batch: int
    check_every: int
    progress_every: float
    update_timeout: float = 120.0


@dataclass
class Records:
    """What one phase observed."""

    queries: list[tuple] = field(default_factory=list)
    """(scheduled, start, end, model index, hot, targets, hits, code, graph_seq, server
    timing by stage)."""
    updates: list[tuple] = field(default_factory=list)
    """(start, end, mutations, added, removed, rows invalidated, graph_seq, code)."""
    checks: list[tuple] = field(default_factory=list)
    """(ack, answered, model index, hops, batch seq, served seq, hits, compared, wrong)."""
    check_errors: Counter = field(default_factory=Counter)
    first_error: str = ""
    last_dst: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


class Latest:
    """A one-slot mailbox: the checker takes the newest acknowledged batch."""

    def __init__(self) -> None:
        self.item: Any = None
        self.closed = False
        self.superseded = 0
        self._event = asyncio.Event()

    def put(self, item: Any) -> None:
        if self.item is not None:
            self.superseded += 1
        self.item = item
        self._event.set()

    def close(self) -> None:
        self.closed = True
        self._event.set()

    async def get(self) -> Any:
        while True:
            if self.item is not None:
                item, self.item = self.item, None
                return item
            if self.closed:
                return None
            self._event.clear()
            await self._event.wait()


def _code(err: BaseException) -> str:
    code = getattr(err, "code", None)
    return getattr(code, "name", None) or type(err).__name__


# --------------------------------------------------------------------------- the phase
async def run_phase(ctx: Context, spec: PhaseSpec) -> dict[str, Any]:
    """Replay the stream with ``spec``'s updates; the phase's summary."""
    loop = asyncio.get_running_loop()
    rec = Records()
    before = ctx.service.metrics(*SCRAPED)
    t0 = loop.time() + 0.05
    stop = t0 + ctx.duration
    inflight: set[asyncio.Task[None]] = set()
    mailbox = Latest()
    updater = checker = None
    if spec.rate:
        updater = loop.create_task(_updates(ctx, spec, t0, stop, rec, mailbox))
        checker = loop.create_task(_checker(ctx, mailbox, rec))
    progress = loop.create_task(_progress(ctx, spec, t0, rec, inflight))
    for req in ctx.stream:
        delay = t0 + req.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(_query(ctx, req, t0 + req.at, rec))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    if updater is not None:
        await updater
    else:
        await asyncio.sleep(max(0.0, stop - loop.time()))
    updates_end = loop.time()
    if inflight:
        await asyncio.wait(set(inflight), timeout=ctx.timeout + 5)
    if checker is not None:
        mailbox.close()
        await checker
    progress.cancel()
    quiet = await _quiet_check(ctx, rec) if ctx.cached and spec.rate else None
    after = ctx.service.metrics(*SCRAPED)
    return summarize(ctx, spec, rec, t0, updates_end, mailbox.superseded, quiet, before, after)


async def _query(ctx: Context, req: Request, sched: float, rec: Records) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    model = MODELS.index(req.model)
    try:
        res = await ctx.emb.get_embeddings_with_info(req.model, req.ids, timeout=ctx.timeout)
    except Exception as err:  # HopserveError (a status) or a client-side failure
        rec.queries.append((sched, start, loop.time(), model, req.hot, req.ids.size, 0,
                            _code(err), -1, {}))  # fmt: skip
        rec.first_error = rec.first_error or f"query: {err}"
        return
    rec.queries.append((sched, start, loop.time(), model, req.hot, req.ids.size, res.cache_hits,
                        "OK", res.graph_seq, res.timing))  # fmt: skip


async def _updates(
    ctx: Context, spec: PhaseSpec, t0: float, stop: float, rec: Records, mailbox: Latest
) -> None:
    """Send batches until ``stop`` (at the phase's rate, or back to back)."""
    loop = asyncio.get_running_loop()
    if math.isinf(spec.rate):
        while loop.time() < stop:
            await _send(ctx, ctx.max_batch, rec, mailbox)
        return
    due, last, tick = 0.0, t0, t0
    while True:
        tick = max(tick + spec.interval, loop.time() - spec.interval)
        delay = tick - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = loop.time()
        if now >= stop:
            return
        due += spec.rate * (now - last)
        last = now
        if due >= 1.0:
            k = int(due)
            due -= k
            await _send(ctx, k, rec, mailbox)


async def _send(ctx: Context, k: int, rec: Records, mailbox: Latest) -> None:
    loop = asyncio.get_running_loop()
    batch = ctx.source.batch(k)
    removes = (batch.remove_src, batch.remove_dst) if batch.remove_src.size else None
    start = loop.time()
    try:
        res = await ctx.admin.update_graph(
            MODELS[0],
            add_edges=(batch.add_src, batch.add_dst),
            remove_edges=removes,
            timeout=ctx.update_timeout,
        )
    except Exception as err:
        rec.updates.append((start, loop.time(), batch.mutations, 0, 0, 0, -1, _code(err)))
        rec.first_error = rec.first_error or f"update: {err}"
        return
    end = loop.time()
    ctx.source.commit(batch)
    rec.updates.append((start, end, batch.mutations, res.edges_added, res.edges_removed,
                        res.rows_invalidated, res.graph_seq, "OK"))  # fmt: skip
    rec.last_dst = batch.add_dst[-64:]
    mailbox.put((res.graph_seq, batch.probe, end))


async def _checker(ctx: Context, mailbox: Latest, rec: Records) -> None:
    """Read-your-writes after each acknowledged batch (the newest one)."""
    loop = asyncio.get_running_loop()
    n = 0
    while (item := await mailbox.get()) is not None:
        seq, probe, acked = item
        model = n % len(MODELS)
        n += 1
        ids = np.asarray([probe.node], dtype=np.int64)
        try:
            res = await ctx.emb.get_embeddings_with_info(MODELS[model], ids, timeout=ctx.timeout)
        except Exception as err:
            rec.check_errors[_code(err)] += 1
            continue
        seen = loop.time()
        compared = wrong = 0
        if ctx.check_every and n % ctx.check_every == 0:
            try:
                ref = await ctx.emb.get_embeddings_with_info(
                    MODELS[model], ids, cache_policy="bypass", timeout=ctx.timeout
                )
            except Exception as err:
                rec.check_errors[_code(err)] += 1
                ref = None
            if ref is not None and ref.graph_seq == res.graph_seq:
                compared, wrong = 1, wrong_rows(res.embeddings, ref.embeddings)
        rec.checks.append((acked, seen, model, probe.hops, seq, res.graph_seq, res.cache_hits,
                           compared, wrong))  # fmt: skip


async def _quiet_check(ctx: Context, rec: Records) -> dict[str, int]:
    """With no update in flight: cached answers (probes, 64 hot keys, the last batch's
    destinations) against recomputations, per model."""
    await asyncio.sleep(0.5)  # let the last write-backs land
    probes = np.asarray([p.node for p in ctx.probes], dtype=np.int64)
    nodes = np.unique(np.concatenate([probes, ctx.hot[:64], rec.last_dst]))
    out = {"rows_compared": 0, "wrong_rows": 0, "cache_hits": 0, "not_comparable": 0}
    for model in MODELS:
        try:
            got = await ctx.emb.get_embeddings_with_info(model, nodes, timeout=ctx.timeout * 3)
            ref = await ctx.emb.get_embeddings_with_info(
                model, nodes, cache_policy="bypass", timeout=ctx.timeout * 3
            )
        except Exception as err:
            rec.check_errors[_code(err)] += 1
            continue
        if got.graph_seq != ref.graph_seq:
            out["not_comparable"] += nodes.size
            continue
        out["rows_compared"] += nodes.size
        out["cache_hits"] += got.cache_hits
        out["wrong_rows"] += wrong_rows(got.embeddings, ref.embeddings)
    return out


async def _progress(
    ctx: Context, spec: PhaseSpec, t0: float, rec: Records, inflight: set[Any]
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(ctx.progress_every)
        q = [r for r in rec.queries if r[7] == "OK"]
        rows = sum(r[5] for r in q)
        hits = sum(r[6] for r in q) / rows if rows else math.nan
        ups = [u for u in rec.updates if u[7] == "OK"]
        muts = sum(u[2] for u in ups)
        seq = ups[-1][6] if ups else "-"
        log(
            f"{ctx.config}/{spec.name}: {loop.time() - t0:5.1f}/{ctx.duration:g} s, "
            f"{len(q)} queries ok, {len(rec.queries) - len(q)} failed, hit ratio {hits:.2f}, "
            f"{len(inflight)} in flight; {muts} mutations in {len(ups)} batches (seq {seq}); "
            f"{len(rec.checks)} checks"
        )


# --------------------------------------------------------------------------- summary
def summarize(
    ctx: Context,
    spec: PhaseSpec,
    rec: Records,
    t0: float,
    updates_end: float,
    superseded: int,
    quiet: dict[str, int] | None,
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    """The phase's numbers (latencies in ms, from the scheduled arrival)."""
    out: dict[str, Any] = {"phase": spec.name, "update_rate": spec.rate, "queries": {}}
    q = rec.queries
    ok = [r for r in q if r[7] == "OK"]
    out["queries"] = _query_stats(ok, ctx.duration)
    out["queries"]["sent"] = len(q)
    out["queries"]["errors"] = dict(Counter(r[7] for r in q if r[7] != "OK"))
    jobs = {}
    for outcome in ("ok", "replanned"):
        name = SCRAPED[2]
        done = metric_total(after, name, outcome=outcome)
        jobs[outcome] = _zero(done) - _zero(metric_total(before, name, outcome=outcome))
    out["worker_jobs"] = jobs  # jobs the front-end ran, and refused as planned too early
    for i, model in enumerate(MODELS):
        out["queries"][model] = _query_stats([r for r in ok if r[3] == i], ctx.duration)
    if spec.rate:
        out["updates"] = _update_stats(rec.updates, t0, updates_end, before, after)
        out["checker"] = _check_stats(rec, superseded, quiet)
    out["first_error"] = rec.first_error
    return out


def _query_stats(rows: list[tuple], duration: float) -> dict[str, Any]:
    lat = np.asarray([(r[2] - r[0]) * 1e3 for r in rows])
    service = np.asarray([(r[2] - r[1]) * 1e3 for r in rows])
    targets = sum(r[5] for r in rows)
    hot = [r for r in rows if r[4]]
    hot_targets = sum(r[5] for r in hot)
    cold = [r for r in rows if not r[4]]
    cold_targets = sum(r[5] for r in cold)
    p = pct(lat, (50, 95, 99))
    stages: dict[str, float] = {}
    for r in rows:
        for key, seconds in r[9].items():
            stages[key] = stages.get(key, 0.0) + seconds * 1e3 / len(rows)
    if rows:  # client latency the server's stages do not account for (network, waits)
        stages["outside_server"] = float(np.mean(lat)) - stages.get("total", 0.0)
    return {
        "ok": len(rows),
        "qps": len(rows) / duration,
        "p50_ms": p["p50"],
        "p95_ms": p["p95"],
        "p99_ms": p["p99"],
        "max_ms": float(lat.max()) if lat.size else math.nan,
        "service_p99_ms": pct(service)["p99"],
        "hit_ratio": sum(r[6] for r in rows) / targets if targets else math.nan,
        "hot_hit_ratio": sum(r[6] for r in hot) / hot_targets if hot_targets else math.nan,
        "zipf_hit_ratio": sum(r[6] for r in cold) / cold_targets if cold_targets else math.nan,
        "mean_ms": float(lat.mean()) if lat.size else math.nan,
        "stages_mean_ms": stages,
    }


def _update_stats(
    rows: list[tuple], t0: float, end: float, before: dict[str, float], after: dict[str, float]
) -> dict[str, Any]:
    ok = [u for u in rows if u[7] == "OK"]
    span = max((ok[-1][1] if ok else end) - t0, 1e-9)
    mutations = sum(u[3] + u[4] for u in ok)
    inv = np.asarray([u[5] for u in ok], dtype=float)
    sizes = np.asarray([u[3] + u[4] for u in ok], dtype=float)
    ack = np.asarray([(u[1] - u[0]) * 1e3 for u in ok])
    count = metric_total(after, SCRAPED[1]) - _zero(metric_total(before, SCRAPED[1]))
    total = metric_total(after, SCRAPED[0]) - _zero(metric_total(before, SCRAPED[0]))
    rows_p = pct(inv, (50, 90, 99))
    return {
        "batches": len(ok),
        "errors": dict(Counter(u[7] for u in rows if u[7] != "OK")),
        "mutations": int(mutations),
        "edges_added": int(sum(u[3] for u in ok)),
        "edges_removed": int(sum(u[4] for u in ok)),
        "seconds": span,
        "mutations_per_s": mutations / span,
        "batch_mutations_mean": float(sizes.mean()) if sizes.size else math.nan,
        "ack_ms": {**pct(ack, (50, 99)), "max": float(ack.max()) if ack.size else math.nan},
        "server_apply_ms_mean": 1e3 * total / count if count and count > 0 else math.nan,
        "rows_invalidated": {
            **rows_p,
            "max": float(inv.max()) if inv.size else math.nan,
            "mean": float(inv.mean()) if inv.size else math.nan,
            "per_mutation": float(inv.sum() / sizes.sum()) if sizes.sum() else math.nan,
            "per_s": float(inv.sum() / span),
        },
        "last_seq": int(ok[-1][6]) if ok else None,
    }


def _zero(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def _check_stats(rec: Records, superseded: int, quiet: dict[str, int] | None) -> dict[str, Any]:
    checks = rec.checks
    lag = np.asarray([(c[1] - c[0]) * 1e3 for c in checks])
    return {
        "checks": len(checks),
        "stale": int(sum(1 for c in checks if c[5] < c[4])),
        "superseded": superseded,
        "errors": dict(rec.check_errors),
        "hits": int(sum(c[6] for c in checks)),
        "compared": int(sum(c[7] for c in checks)),
        "wrong_rows": int(sum(c[8] for c in checks)),
        "two_hop_checks": int(sum(1 for c in checks if c[3] == 2)),
        "ack_to_answer_ms": pct(lag),
        "quiet": quiet,
    }


# --------------------------------------------------------------------------- one-offs
async def warm_up(ctx: Context, concurrency: int = 4) -> dict[str, float]:
    """The first update (builds the out-edge index invalidation needs), then the stream
    once, closed loop (fills the cache), and the probes; seconds of each."""
    loop = asyncio.get_running_loop()
    out: dict[str, float] = {}
    start = loop.time()
    res = await ctx.admin.update_graph(
        MODELS[0], add_edges=(ctx.view.ids[:1], ctx.view.ids[1:2]), timeout=ctx.update_timeout
    )
    out["first_update_s"] = loop.time() - start
    out["first_update_rows_invalidated"] = res.rows_invalidated
    requests = ctx.stream if ctx.cached else ctx.stream[:20]
    start = loop.time()
    queue = list(requests)

    async def worker() -> None:
        while queue:
            req = queue.pop()
            try:
                await ctx.emb.get_embeddings_with_info(req.model, req.ids, timeout=60)
            except Exception as err:  # counted in the phases; a warm-up failure is logged
                log(f"{ctx.config}: warm-up request failed: {err}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    probes = np.asarray([p.node for p in ctx.probes], dtype=np.int64)
    for model in MODELS:
        await ctx.emb.get_embeddings_with_info(model, probes, timeout=60)
    await asyncio.sleep(0.5)  # write-backs land
    out["warm_stream_s"] = loop.time() - start
    return out


async def cold_start(ctx: Context, reps: int, set_size: int, degree: int) -> dict[str, Any]:
    """New nodes: ``reps`` batches adding ``set_size`` nodes (``degree`` in- and out-edges
    each), then per model: one 1-node request (pays whatever a new sequence costs), the
    new nodes, and ``set_size`` existing nodes recomputed (cache bypass)."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(11)
    cols: dict[str, dict[str, list[float]]] = {
        m: {"update_ms": [], "first_ms": [], "new_ms": [], "existing_ms": []} for m in MODELS
    }
    wrong = stale = compared = hits = 0
    for i in range(reps):
        model = MODELS[i % len(MODELS)]
        new, feats, src, dst = ctx.source.new_nodes(set_size, degree)
        t = loop.time()
        res = await ctx.admin.update_graph(
            MODELS[0], add_nodes=(new, feats), add_edges=(src, dst), timeout=ctx.update_timeout
        )
        cols[model]["update_ms"].append((loop.time() - t) * 1e3)
        one = ctx.view.ids[rng.integers(ctx.view.num_nodes, size=1)]
        existing = ctx.view.ids[rng.integers(ctx.view.num_nodes, size=set_size)]
        timings = []
        for ids, policy in ((one, "bypass"), (new, "use"), (existing, "bypass")):
            t = loop.time()
            got = await ctx.emb.get_embeddings_with_info(
                model, ids, cache_policy=policy, timeout=60
            )
            timings.append((loop.time() - t) * 1e3)
            if ids is new:
                answer = got
        for key, ms in zip(("first_ms", "new_ms", "existing_ms"), timings, strict=True):
            cols[model][key].append(ms)
        stale += int(answer.graph_seq < res.graph_seq)
        hits += answer.cache_hits
        ref = await ctx.emb.get_embeddings_with_info(model, new, cache_policy="bypass", timeout=60)
        if ref.graph_seq == answer.graph_seq:
            compared += new.size
            wrong += wrong_rows(answer.embeddings, ref.embeddings)
    out: dict[str, Any] = {"reps": reps, "set_size": set_size, "degree": degree}
    for model, c in cols.items():
        out[model] = {k: {**pct(v), "n": len(v)} for k, v in c.items()}
    out.update({"stale": stale, "hits": hits, "rows_compared": compared, "wrong_rows": wrong})
    return out


async def hub_updates(ctx: Context, hubs: dict[str, int]) -> list[dict[str, Any]]:
    """One-edge batches touching the hubs (and random ones to compare): rows invalidated
    (both models' kinds) and acknowledgement time."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(12)

    def rand() -> int:
        return int(ctx.view.ids[rng.integers(ctx.view.num_nodes)])

    cases = [
        ("random → random", rand(), rand()),
        ("random → random", rand(), rand()),
        ("random → random", rand(), rand()),
        (f"random → max in-degree node ({hubs['in_hub_degree']:,} in)", rand(), hubs["in_hub"]),
        (f"random → max out-degree node ({hubs['out_hub_degree']:,} out)", rand(),
         hubs["out_hub"]),
        ("max out-degree node → random", hubs["out_hub"], rand()),
    ]  # fmt: skip
    out = []
    for name, src, dst in cases:
        t = loop.time()
        res = await ctx.admin.update_graph(
            MODELS[0], add_edges=([src], [dst]), timeout=ctx.update_timeout
        )
        out.append({"edge": name, "rows_invalidated": res.rows_invalidated,
                    "ack_ms": (loop.time() - t) * 1e3})  # fmt: skip
    return out
