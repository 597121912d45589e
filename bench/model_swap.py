"""Model swaps under steady load: failed requests (goal 0) and the p99 latency spike.

The real service: ``hopserve serve`` in its own process (in-process worker, Redis cache on
a private ``redis-server``) serves version 1 of a 2-layer GraphSAGE on a synthetic
power-law graph. An open-loop generator in this process sends unversioned requests at a
fixed rate (so a stall shows as latency, not as fewer requests: no coordinated
omission), each asking for a Zipf-popular set of nodes. After a baseline, the admin API
swaps versions ``--swaps`` times: ``LoadModel`` (the next version, different weights,
``make_default``: loaded and self-checked beside the served one, then default in one
step), a pause with both loaded, ``UnloadModel`` of the old one (its requests in flight
drain first).

Every answer is checked against its version's own full-graph forward (computed here with
the same weights): a row of one version served as another counts as *wrong*. Reported
per phase (baseline, each swap window from ``LoadModel`` to 1 s after ``UnloadModel``,
the tail after the last swap): requests, failed, wrong rows, p50/p99/max latency and
p99 over the baseline's; per swap the ``LoadModel`` and ``UnloadModel`` call times and
the requests drained. A new version starts with a cold cache (keys carry the version),
so part of the spike is recomputing rows the old version had cached.

Outputs ``bench/results/model_swap.{json,md,png}``. Client, server and redis-server
share this machine's cores: the load step's CPU burst lands on the requests in flight.

    python bench/model_swap.py            # default (about 2 minutes)
    python bench/model_swap.py --quick    # smoke check (small graph, short phases; < 1 min)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import numpy as np

MODEL = "sage"
BIN_S = 0.5  # timeline resolution of the plot


# --------------------------------------------------------------------------- data
@dataclass
class Versions:
    """One weights file and one reference (full-graph forward) per version."""

    data: harness.SageData
    ids: np.ndarray  # external IDs in storage order
    weights: dict[str, Path] = field(default_factory=dict)
    reference: dict[str, np.ndarray] = field(default_factory=dict)  # storage order
    index: dict[int, int] = field(default_factory=dict)  # external ID -> storage row

    def entry(self, version: str) -> dict[str, Any]:
        return harness.model_entry(MODEL, self.data, version=version,
                                   weights=str(self.weights[version]))  # fmt: skip

    def rows(self, version: str, ids: np.ndarray) -> np.ndarray:
        return self.reference[version][[self.index[int(i)] for i in ids]]


def prepare(args: argparse.Namespace, count: int) -> Versions:
    """The graph, ``count`` weight files (seeds 0, 1, ...) and their references."""
    import torch

    from hopserve import GraphStore
    from hopserve.examples import GraphSAGE

    data = harness.prepare_sage(Path(args.data), args.nodes, args.avg_degree,
                                hidden=args.hidden, out_dim=args.out_dim)  # fmt: skip
    store = GraphStore.open(data.graph)
    ids = store.to_external(torch.arange(store.num_nodes)).numpy()
    made = Versions(data, ids, index={int(i): r for r, i in enumerate(ids)})
    x, edge_index = store.features.float(), store.edge_index()
    for k in range(count):
        version = str(k + 1)
        path = data.weights if k == 0 else data.weights.with_name(f"sage-v{version}.pt")
        model = GraphSAGE(**data.kwargs)
        if k == 0:
            model.load_state_dict(torch.load(path, weights_only=True))
        else:
            torch.manual_seed(k)
            model = GraphSAGE(**data.kwargs)
            torch.save(model.state_dict(), path)
        with torch.no_grad():
            made.reference[version] = model.eval()(x, edge_index).numpy()
        made.weights[version] = path
    harness.log(f"{count} versions and their references ready ({args.nodes:,} nodes)")
    return made


# --------------------------------------------------------------------------- load
@dataclass
class Record:
    """One request: when it was sent (s since the start), how long it took, the outcome."""

    sent: float
    latency: float
    outcome: str  # "ok" or the status name
    version: str = ""
    wrong: bool = False


class OpenLoop(threading.Thread):
    """Unversioned requests at a fixed rate on an asyncio loop of its own."""

    def __init__(self, target: str, versions: Versions, args: argparse.Namespace) -> None:
        super().__init__(daemon=True, name="open-loop")
        self.target, self.versions, self.args = target, versions, args
        self.records: list[Record] = []
        self.start_time = 0.0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from hopserve.client import AsyncEmbeddingClient, HopserveError
        from hopserve.client.loadtest import LoadSpec, TargetSampler

        args = self.args
        spec = LoadSpec(model=MODEL, set_size=args.set_size, set_size_sigma=0.5, zipf_a=1.1,
                        node_ids=self.versions.ids, seed=1)  # fmt: skip
        sampler = TargetSampler(self.versions.ids, spec)
        pending: set[asyncio.Task[None]] = set()
        async with AsyncEmbeddingClient(self.target, timeout=args.timeout) as client:

            async def one(sent: float, ids: np.ndarray) -> None:
                t = time.perf_counter()
                try:
                    res = await client.get_embeddings_with_info(MODEL, ids)
                except HopserveError as err:
                    self.records.append(Record(sent, time.perf_counter() - t, err.code.name))
                    return
                latency = time.perf_counter() - t
                want = self.versions.rows(res.model_version, ids)
                wrong = not np.allclose(res.embeddings, want, atol=1e-4, rtol=1e-3)
                self.records.append(Record(sent, latency, "ok", res.model_version, wrong))

            self.start_time = start = time.perf_counter()
            k = 0
            while not self._halt.is_set():
                due = start + k / args.rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(one(due - start, sampler.draw()))
                pending.add(task)
                task.add_done_callback(pending.discard)
                k += 1
            if pending:
                await asyncio.wait(pending, timeout=args.timeout + 5)


# --------------------------------------------------------------------------- analysis
def phase_stats(records: list[Record], lo: float, hi: float) -> dict[str, Any]:
    """Requests sent in ``[lo, hi)``: counts and latency percentiles (ms) of the ok ones."""
    inside = [r for r in records if lo <= r.sent < hi]
    ok = np.asarray([r.latency for r in inside if r.outcome == "ok"]) * 1e3
    pct = harness.percentiles(ok, (50, 99)) if ok.size else {"p50": 0.0, "p99": 0.0}
    failed: dict[str, int] = {}
    for r in inside:
        if r.outcome != "ok":
            failed[r.outcome] = failed.get(r.outcome, 0) + 1
    bins = [
        [r.latency for r in inside if r.outcome == "ok" and b <= r.sent < b + BIN_S]
        for b in np.arange(lo, hi, BIN_S)
    ]
    worst = max((float(np.percentile(b, 99)) * 1e3 for b in bins if len(b) >= 10), default=0.0)
    return {
        "from_s": lo,
        "to_s": hi,
        "worst_bin_p99_ms": worst,
        "requests": len(inside),
        "failed": sum(failed.values()),
        "failed_by_status": failed,
        "wrong_version_rows": sum(r.wrong for r in inside),
        "versions": sorted({r.version for r in inside if r.version}),
        "p50_ms": pct["p50"],
        "p99_ms": pct["p99"],
        "max_ms": float(ok.max()) if ok.size else 0.0,
    }


def timeline(records: list[Record], end: float) -> dict[str, list[float]]:
    """Per ``BIN_S`` bin: p99 latency (ms) and answers per second of each version."""
    edges = np.arange(0.0, end + BIN_S, BIN_S)
    p99, per_version = [], {}
    versions = sorted({r.version for r in records if r.version})
    for lo in edges[:-1]:
        lat = [r.latency * 1e3 for r in records if lo <= r.sent < lo + BIN_S and r.outcome == "ok"]
        p99.append(float(np.percentile(lat, 99)) if lat else float("nan"))
    for v in versions:
        sent = np.asarray([r.sent for r in records if r.version == v])
        per_version[v] = (np.histogram(sent, edges)[0] / BIN_S).tolist()
    return {"t": (edges[:-1] + BIN_S / 2).tolist(), "p99_ms": p99, "rps": per_version}


# --------------------------------------------------------------------------- report
def report(summary: dict[str, Any]) -> list[str]:
    base = summary["phases"][0]["p99_ms"] or 1.0
    lines = [
        "# Model swaps under steady load",
        "",
        f"`bench/model_swap.py`: {summary['args']['nodes']:,}-node power-law graph (avg degree "
        f"{summary['args']['avg_degree']:g}), 2-layer GraphSAGE; `hopserve serve` with its "
        f"in-process worker and a Redis cache; open-loop unversioned requests at "
        f"{summary['args']['rate']:g}/s (median {summary['args']['set_size']} nodes, Zipf "
        f"1.1); {len(summary['swaps'])} swaps, each `LoadModel` (next version, "
        "`make_default`) then `UnloadModel` of the old one. Every answer checked against "
        "its version's own full-graph forward.",
        "",
        f"**{summary['total']['failed']} failed requests and "
        f"{summary['total']['wrong_version_rows']} wrong-version answers** out of "
        f"{summary['total']['requests']:,} (goal: 0 and 0).",
        "",
    ]
    rows = []
    for phase in summary["phases"]:
        rows.append([
            phase["name"], f"{phase['requests']:,}", phase["failed"],
            phase["wrong_version_rows"], "+".join(phase["versions"]),
            f"{phase['p50_ms']:.1f}", f"{phase['p99_ms']:.1f}",
            f"{phase['worst_bin_p99_ms']:.1f}", f"{phase['max_ms']:.0f}",
            f"{phase['p99_ms'] / base:.1f}x",
        ])  # fmt: skip
    lines += harness.markdown_table(
        ["phase", "requests", "failed", "wrong version", "versions", "p50 ms", "p99 ms",
         f"worst {BIN_S:g} s p99 ms", "max ms", "p99 / baseline"], rows, "llrrlrrrrr",
    )  # fmt: skip
    lines += ["", "Per swap (the admin calls, measured by the caller):", ""]
    lines += harness.markdown_table(
        ["swap", "LoadModel s", "UnloadModel s (drain incl.)", "requests drained"],
        [[f"{s['old']} → {s['new']}", f"{s['load_s']:.2f}", f"{s['unload_s']:.2f}",
          s["drained_requests"]] for s in summary["swaps"]],
        "lrrr",
    )  # fmt: skip
    lines += [
        "",
        "A swap window runs from the `LoadModel` call to 1 s after `UnloadModel` returned. "
        "The spike comes from the load itself (weights, layer-wise split and its self-check "
        "take CPU from the server's in-process worker on this machine; while the model is "
        "traced no job runs) and from the new version's cold cache.",
        "",
        f"Machine: {harness.machine_line(summary['machine'])}; load average "
        f"{summary['load_average'][0]:.1f} before and {summary['load_average'][1]:.1f} after "
        f"the run (other work shares the cores: read the phases against each other); "
        f"revision {summary['revision'].get('commit', '?')[:12]}.",
        "",
        "![timeline](model_swap.png)",
    ]
    return lines


def plot(summary: dict[str, Any], path: Path) -> None:
    plt = harness.pyplot()
    tl = summary["timeline"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.plot(tl["t"], tl["p99_ms"], color="#2c3e50", lw=1.2, label=f"p99 per {BIN_S:g} s")
    ax1.set_ylabel("latency p99 (ms)")
    ax1.set_yscale("log")
    ax1.legend(loc="upper left", fontsize=8)
    for version, rps in tl["rps"].items():
        ax2.plot(tl["t"], rps, lw=1.2, label=f"version {version}")
    ax2.set_ylabel("answers / s")
    ax2.set_xlabel("seconds since the load started")
    ax2.legend(loc="upper left", fontsize=8)
    spans = [(p["from_s"], p["to_s"], p["name"]) for p in summary["phases"]]
    harness.shade_spans([ax1, ax2], spans, label_ax=ax1)
    events = []
    for s in summary["swaps"]:
        events += [(s["default_at_s"], f"v{s['new']} default ({s['load_s']:.2f} s load)"),
                   (s["unloaded_at_s"], f"v{s['old']} unloaded")]  # fmt: skip
    harness.mark_events([ax1, ax2], events, label_ax=ax2)
    fails = summary["total"]["failed"]
    fig.suptitle(f"Model swaps under {summary['args']['rate']:g} req/s: {fails} failed, "
                 f"{summary['total']['wrong_version_rows']} wrong-version answers")  # fmt: skip
    harness.save_figure(fig, path)


# --------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    p = harness.parser(__doc__)
    harness.add_graph_args(p, nodes=100_000, avg_degree=10.0)
    harness.add_model_args(p, hidden=64, out_dim=32)
    p.add_argument("--rate", type=float, default=150.0, help="requests per second (open loop)")
    p.add_argument("--set-size", type=int, default=16, help="median nodes per request")
    p.add_argument("--swaps", type=int, default=3)
    p.add_argument("--warmup", type=float, default=5.0, help="seconds not reported")
    p.add_argument("--baseline", type=float, default=15.0, help="seconds before the first swap")
    p.add_argument("--both", type=float, default=4.0, help="seconds both versions are loaded")
    p.add_argument("--after", type=float, default=8.0, help="seconds after each unload")
    p.add_argument("--timeout", type=float, default=30.0, help="client deadline per request")
    p.add_argument(
        "--quick", action="store_true",
        help="smoke check: 20K nodes, short phases, one swap; writes to a temporary folder "
        "unless --out is given",
    )  # fmt: skip
    harness.add_io_args(p, data=harness.REPO / "data")
    p.set_defaults(out=None)
    args = p.parse_args()
    if args.quick:
        args.nodes, args.swaps, args.rate = 20_000, 1, 60.0
        args.warmup, args.baseline, args.both, args.after = 2.0, 4.0, 2.0, 3.0
        if args.out is None:
            args.out = tempfile.mkdtemp(prefix="hopserve-model-swap-quick-")
    if args.out is None:
        args.out = str(harness.RESULTS)
    return args


def main() -> None:
    args = parse_args()
    from hopserve.client import AdminClient

    versions = prepare(args, args.swaps + 1)
    load_before = os.getloadavg()[0]
    swaps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hopserve-bench-swap-") as tmp:
        redis = harness.RedisServer.launch(Path(tmp) / "redis", maxmemory="1gb")
        port = harness.free_port()
        config = harness.write_config(
            Path(tmp) / "hopserve.yaml", [versions.entry("1")],
            server={"port": port, "metrics_port": 0, "max_wait_ms": 2.0},
            cache={"backend": "redis", "redis_url": redis.url},
        )  # fmt: skip
        server = harness.start_frontend(config, port, Path(tmp) / "serve.log", model=MODEL)
        target = f"127.0.0.1:{port}"
        load = OpenLoop(target, versions, args)
        try:
            load.start()
            time.sleep(args.warmup + args.baseline)
            with AdminClient(target, timeout=600) as admin:
                for k in range(args.swaps):
                    old, new = str(k + 1), str(k + 2)
                    at = time.perf_counter() - load.start_time
                    harness.log(f"swap {old} -> {new}: LoadModel …")
                    info = admin.load_model(versions.entry(new), make_default=True)
                    default_at = time.perf_counter() - load.start_time
                    assert info.is_default, info
                    time.sleep(args.both)
                    unload_at = time.perf_counter() - load.start_time
                    drained = admin.unload_model(MODEL, old).drained_requests
                    unloaded_at = time.perf_counter() - load.start_time
                    swaps.append({
                        "old": old, "new": new, "load_at_s": at, "default_at_s": default_at,
                        "load_s": default_at - at, "unload_at_s": unload_at,
                        "unloaded_at_s": unloaded_at, "unload_s": unloaded_at - unload_at,
                        "drained_requests": drained,
                    })  # fmt: skip
                    harness.log(
                        f"swap {old} -> {new}: load {default_at - at:.2f}s, unload "
                        f"{unloaded_at - unload_at:.2f}s ({drained} drained)"
                    )
                    time.sleep(args.after)
        finally:
            load.stop()
            load.join(args.timeout + 30)
            server.terminate()
            redis.stop()
    end = max(r.sent for r in load.records)
    phases = [{"name": "baseline", **phase_stats(load.records, args.warmup, swaps[0]["load_at_s"])}]
    for k, s in enumerate(swaps):
        hi = s["unloaded_at_s"] + 1.0
        phases.append({"name": f"swap {s['old']}→{s['new']}",
                       **phase_stats(load.records, s["load_at_s"], hi)})  # fmt: skip
        nxt = swaps[k + 1]["load_at_s"] if k + 1 < len(swaps) else end + 1
        phases.append({"name": f"after {s['new']}", **phase_stats(load.records, hi, nxt)})
    summary = {
        "args": vars(args),
        "machine": harness.machine_info(),
        "revision": harness.git_revision(),
        "total": phase_stats(load.records, args.warmup, end + 1),
        "phases": phases,
        "swaps": swaps,
        "timeline": timeline(load.records, end - BIN_S),  # the last bin: cut by the stop
        "load_average": [load_before, os.getloadavg()[0]],
    }
    harness.write_outputs(Path(args.out), "model_swap", summary, report(summary),
                          lambda path: plot(summary, path))  # fmt: skip
    harness.log(f"wrote {args.out}/model_swap.{{json,md,png}}")


if __name__ == "__main__":
    main()
