"""All-node embedding on 1, 2 and 4 ranks (`embed_all` under torchrun, gloo on loopback).

The engine benchmarks' graph (synthetic power-law, 200K nodes, average in-degree 20,
128-dim features, RCMK order) and model (``full_eval.make_model``: GraphSAGE-mean x3,
hidden 256, out 64). Each world size runs as its own ``torchrun --standalone`` job; every
rank runs this script's ``--rank-report`` mode, which calls
:func:`~hopserve.worker.distributed.embed_all` and writes one JSON record (per-layer
compute seconds, halo rows and bytes, exchange and wait seconds, peak RSS). The parent
aggregates them and reports, per world size:

* time (the job on every rank, and its split into compute, halo transfer, waiting for
  the slowest rank, and the rest: setup and the Parquet write), speedup vs 1 rank;
* bytes exchanged per layer against the halo lower bound: the distinct remote rows each
  rank reads (computed here, independently of the job, from the CSC and the partition)
  times the row width, summed over ranks;
* peak RSS per rank; the max abs difference of the Parquet shards (``read_embeddings``)
  from the 1-rank result;
* a scaling model for a 1.6B-edge graph (ogbn-papers100M sizes) on 16 machines, computed
  from the measured per-layer costs, next to what DEAL and InferTurbo report.

``python -m torch.distributed.run`` is ``torchrun`` with this interpreter; layer
checkpoints are off (the benchmark measures compute and exchange, not checkpoint I/O).

Ratios are measured side by side in one run (world sizes interleaved, best of
``--repeat``); with ``os.cpu_count()`` cores the speedup is bounded by that count, and
more ranks than cores oversubscribe them. Outputs ``bench/results/embed_all.{json,md,png}``.

    python bench/embed_all.py                         # 200K nodes / 4M edges, 1,2,4 ranks
    python bench/embed_all.py --nodes 20000 --repeat 1 --out /tmp/smoke   # a smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
from full_eval import make_model

# Options the parent passes on to every rank.
CHILD_KEYS = ("dim", "hidden", "out_dim", "layers", "budget_mb")

# The scaling model's target: ogbn-papers100M's sizes (DEAL Table 4).
TARGET = {"name": "ogbn-papers100M", "nodes": 111_059_956, "edges": 1_615_685_872, "dim": 128}


# --------------------------------------------------------------------------- one rank
def rank_report(args: argparse.Namespace) -> None:
    """One rank of a torchrun job: ``embed_all`` on the graph, its record as JSON in
    ``--report-dir/rank-R.json``."""
    import torch

    from hopserve import GraphStore
    from hopserve.worker.distributed import embed_all

    torch.set_num_threads(args.threads)
    model = make_model(args.dim, args.hidden, args.out_dim, args.layers, "sage")
    graph = GraphStore.open(args.graph)
    comm = timed_comm_class().from_env("cpu", timeout_s=600)
    marks = _BlockMarks(comm.events)
    base_rss = harness.current_rss_mb()
    try:
        result = embed_all(
            model,
            graph,
            args.emb,
            checkpoint_dir=None,
            comm=comm,
            progress=False,
            memory_budget_bytes=args.budget_mb << 20,
        )
    finally:
        marks.close()
        comm.close()
    indptr = graph.topology.indptr
    record = {
        "rank": result.rank,
        "world_size": result.world_size,
        "threads": args.threads,
        "start": result.start,
        "end": result.end,
        "rows": result.end - result.start,
        "edges": int(indptr[result.end]) - int(indptr[result.start]),
        "halo_rows": comm.halo_rows,
        "plan_halo_s": comm.plan_s,
        "total_s": result.total_s,
        "layers": _per_layer(result, comm.events),
        "baseline_rss_mb": base_rss,
        "peak_rss_mb": harness.peak_rss_mb(),
    }
    path = Path(args.report_dir) / f"rank-{result.rank}.json"
    path.write_text(json.dumps(record))


@functools.cache
def timed_comm_class() -> type:
    """:class:`~hopserve.worker.distributed.exchange.Comm` timing its halo exchanges (built
    on first use: only the ranks import torch)."""
    from hopserve.worker.distributed.exchange import Comm

    class TimedComm(Comm):
        """The job's process group, timing each halo exchange: first a barrier (the wait
        for the slowest rank: load imbalance), then the ``all_to_all`` itself."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.events: list[dict[str, Any]] = []  # exchanges and block ends, in order
            self.plan_s = 0.0
            self.halo_rows = 0

        def plan_halo(self, partition, indptr, indices):  # noqa: ANN001, ANN202
            t = time.perf_counter()
            plan = super().plan_halo(partition, indptr, indices)
            self.plan_s = time.perf_counter() - t
            self.halo_rows = int(plan.need.size)
            return plan

        def exchange(self, plan, local):  # noqa: ANN001, ANN202
            t0 = time.perf_counter()
            self.barrier()
            t1 = time.perf_counter()
            table, stats = super().exchange(plan, local)
            t2 = time.perf_counter()
            self.events.append(
                {"kind": "exchange", "wait_s": t1 - t0, "exchange_s": t2 - t1,
                 "bytes_received": stats.bytes_received}
            )  # fmt: skip
            return table, stats

    return TimedComm


class _BlockMarks(logging.Handler):
    """Marks the end of each computed block in ``events``: the job logs one line per block
    (``rank R block B: ...``) after its halo exchanges, so the exchanges recorded since
    the previous mark belong to that block."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events
        self.logger = logging.getLogger("hopserve.worker.distributed.job")
        self.level_before = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("rank %d block %d:"):
            self.events.append({"kind": "block", "block": int(record.args[1])})

    def close(self) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)
        super().close()


def _per_layer(result: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's :class:`LayerReport` s with each block's exchange and wait seconds."""
    layers, pending = [], []
    by_block: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event["kind"] == "exchange":
            pending.append(event)
        else:
            by_block[event["block"]], pending = pending, []
    for report in result.layers:
        mine = by_block.get(report.block, [])
        received = sum(e["bytes_received"] for e in mine)
        if received != report.halo_bytes_received:
            raise RuntimeError(
                f"block {report.block}: {received} bytes timed, the job reports "
                f"{report.halo_bytes_received}: the job's per-block log line changed?"
            )
        layers.append(
            vars(report)
            | {
                "exchanges": len(mine),
                "exchange_s": sum(e["exchange_s"] for e in mine),
                "wait_s": sum(e["wait_s"] for e in mine),
            }
        )
    return layers


# --------------------------------------------------------------------------- one world
def run_world(args: argparse.Namespace, graph: str, world: int, scratch: Path) -> dict[str, Any]:
    """``torchrun --standalone --nproc-per-node world`` of this script's rank mode; the
    ranks' records, the wall time of the whole launch, and where the shards are."""
    emb, reports = scratch / f"emb-w{world}", scratch / f"reports-w{world}"
    for folder in (emb, reports):
        shutil.rmtree(folder, ignore_errors=True)
    reports.mkdir(parents=True)
    threads = max(1, args.threads // world)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(world), __file__, "--rank-report",
        "--graph", graph, "--emb", str(emb), "--report-dir", str(reports),
        "--threads", str(threads),
    ]  # fmt: skip
    for key in CHILD_KEYS:
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "GLOO_SOCKET_IFNAME": "lo"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{world} rank(s) failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    ranks = [json.loads((reports / f"rank-{r}.json").read_text()) for r in range(world)]
    return {"world_size": world, "threads_per_rank": threads, "launch_wall_s": wall,
            "emb": str(emb), "ranks": ranks}  # fmt: skip


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Per-layer and whole-job figures of one world size (max over ranks for times: the
    job waits for its slowest rank)."""
    ranks = run["ranks"]
    n_layers = len(ranks[0]["layers"])
    layers = []
    for i in range(n_layers):
        per = [r["layers"][i] for r in ranks]
        layers.append({
            "block": per[0]["block"],
            "compute_s": max(x["seconds"] for x in per),
            "compute_s_per_rank": [x["seconds"] for x in per],
            "exchange_s": max(x["exchange_s"] for x in per),
            "wait_s": max(x["wait_s"] for x in per),
            "halo_rows_received": sum(x["halo_rows_received"] for x in per),
            "bytes_sent": sum(x["halo_bytes_sent"] for x in per),
            "bytes_received": sum(x["halo_bytes_received"] for x in per),
        })  # fmt: skip
    total = max(r["total_s"] for r in ranks)
    compute = sum(x["compute_s"] for x in layers)
    exchange = sum(x["exchange_s"] for x in layers)
    wait = sum(x["wait_s"] for x in layers)
    return {
        "world_size": run["world_size"],
        "threads_per_rank": run["threads_per_rank"],
        "launch_wall_s": run["launch_wall_s"],
        "job_s": total,
        "compute_s": compute,
        "exchange_s": exchange,
        "wait_s": wait,
        "other_s": max(0.0, total - compute - exchange - wait),
        "layers": layers,
        "rows_per_rank": [r["rows"] for r in ranks],
        "edges_per_rank": [r["edges"] for r in ranks],
        "halo_rows_per_rank": [r["halo_rows"] for r in ranks],
        "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in ranks],
        "baseline_rss_mb_per_rank": [r["baseline_rss_mb"] for r in ranks],
    }


# --------------------------------------------------------------------------- lower bound
def halo_lower_bound(indptr: Any, indices: Any, world: int) -> list[int]:
    """Distinct remote in-neighbours of each rank's range under the job's partition,
    counted here with a mask (independently of the job's ``halo_ids``)."""
    import numpy as np

    from hopserve.worker.distributed import partition_by_edges

    part = partition_by_edges(indptr, world)
    n = indptr.size - 1
    counts = []
    for r in range(world):
        a, b = part.range(r)
        mask = np.zeros(n, dtype=bool)
        mask[indices[indptr[a] : indptr[b]]] = True
        mask[a:b] = False
        counts.append(int(mask.sum()))
    return counts


def exchanged_widths(args: argparse.Namespace) -> list[int]:
    """Widths of the values exchanged, in order: every layer's output a later layer reads
    over its sources (all but the last; layer 0 reads the features from the store)."""
    dims = [args.dim] + [args.hidden] * (args.layers - 1) + [args.out_dim]
    return dims[1:-1]


# --------------------------------------------------------------------------- model
def scaling_model(
    args: argparse.Namespace,
    results: dict[int, dict[str, Any]],
    halo_fraction: dict[int, float],
    n: int,
    e: int,
) -> dict[str, Any]:
    """1.6B edges on ``--model-machines`` machines, from the measured per-layer costs.

    compute: core-seconds per edge per layer (measured on ranks of one thread each, the
    2-rank run when there is one) × edges per machine / cores per machine (perfect scaling
    over a machine's cores: optimistic, the aggregation is memory-bound);
    exchange: halo rows per machine × row bytes / network bandwidth, with the halo
    fraction (halo rows / own rows) of this graph's RCMK partition at that many ranks
    (optimistic) and of sources drawn uniformly (no locality: pessimistic).
    """
    ref_world = 2 if 2 in results else min(results)
    ref = results[ref_world]
    edges = sum(ref["edges_per_rank"])
    core_s_per_edge = []
    for layer in ref["layers"]:
        core_s = sum(layer["compute_s_per_rank"]) * ref["threads_per_rank"]
        core_s_per_edge.append(core_s / edges)
    widths = exchanged_widths(args)
    tn, te = TARGET["nodes"], TARGET["edges"]
    degree = te / tn

    def fractions(p: int) -> dict[str, float]:
        """Halo rows / own rows per machine at ``p`` machines."""
        rows = tn / p
        uniform = (tn - rows) * (1 - math.exp(-degree / p)) / rows  # expected, sources uniform
        return {"RCMK synthetic (optimistic)": halo_fraction[p], "uniform (pessimistic)": uniform}

    def scenarios_at(p: int) -> list[dict[str, Any]]:
        rows = tn / p
        compute_s = sum(core_s_per_edge) * (te / p) / args.model_cores
        out = []
        for label, frac in fractions(p).items():
            halo_bytes = frac * rows * sum(4 * w for w in widths)  # per machine, all layers
            for gbps in args.model_gbps:
                exchange_s = halo_bytes / (gbps * 1e9 / 8)
                total = compute_s + exchange_s
                out.append({
                    "machines": p, "halo": label, "halo_fraction": frac, "bandwidth_gbps": gbps,
                    "compute_s": compute_s, "exchange_s": exchange_s, "total_s": total,
                    "halo_gb_per_machine": halo_bytes / 1e9, "edges_per_s": te / total,
                })  # fmt: skip
        return out

    p = args.model_machines
    scenarios = scenarios_at(p)
    # Strong scaling from 2 machines, as DEAL's Fig. 15(d) measures it.
    strong = [
        {"halo": a["halo"], "bandwidth_gbps": a["bandwidth_gbps"], "total_2_s": a["total_s"],
         "total_p_s": b["total_s"], "speedup": a["total_s"] / b["total_s"]}
        for a, b in zip(scenarios_at(2), scenarios, strict=True)
    ]  # fmt: skip
    rows = tn / p
    # The compute term checked on the measured world sizes: the same core-seconds per
    # edge, over the cores a rank had (its threads, or its share of an oversubscribed
    # machine), against the measured compute of the slowest rank.
    cores = os.cpu_count() or 1
    check = []
    for w, r in sorted(results.items()):
        per_rank_cores = min(r["threads_per_rank"], cores / w)
        predicted = sum(core_s_per_edge) * max(r["edges_per_rank"]) / per_rank_cores
        check.append({"world_size": w, "cores_per_rank": per_rank_cores,
                      "predicted_compute_s": predicted, "measured_compute_s": r["compute_s"]})  # fmt: skip
    measured_edges_per_s = {w: e / r["job_s"] for w, r in results.items()}
    return {
        "target": TARGET,
        "machines": p,
        "cores_per_machine": args.model_cores,
        "reference_world_size": ref_world,
        "core_ns_per_edge_per_layer": [c * 1e9 for c in core_s_per_edge],
        "target_degree": degree,
        "graph_nodes": n,
        "graph_edges": e,
        "graph_degree": e / n,
        "exchanged_widths": widths,
        "measured_cores": cores,
        "scenarios": scenarios,
        "strong_scaling_from_2": strong,
        "compute_check": check,
        "halo_gb_per_machine_per_layer": {
            k: f * rows * 4 * max(widths) / 1e9 for k, f in fractions(p).items()
        },
        "measured_edges_per_s": measured_edges_per_s,
        "inferturbo_edges_per_s": 1e11 / 7200,
    }


# --------------------------------------------------------------------------- driver
def parse_args() -> argparse.Namespace:
    p = harness.parser(__doc__)
    harness.add_graph_args(p, nodes=200_000, avg_degree=20.0, dim=128)
    harness.add_model_args(p, hidden=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads over all ranks (each rank gets threads // world, at least 1)",
    )
    p.add_argument("--budget-mb", type=int, default=64, help="hopserve CPU batch budget per rank")
    p.add_argument("--worlds", default="1,2,4", help="world sizes (ranks)")
    p.add_argument("--repeat", type=int, default=3, help="runs per world size (best kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-machines", type=int, default=16)
    p.add_argument("--model-cores", type=int, default=32, help="cores per modelled machine")
    p.add_argument(
        "--model-gbps",
        type=float,
        nargs="+",
        default=[25.0, 100.0],
        help="modelled network bandwidths (Gb/s per machine)",
    )
    harness.add_io_args(p)
    p.add_argument("--rank-report", action="store_true", help=argparse.SUPPRESS)
    harness.add_child_args(p, "graph", "emb", "report_dir")
    return p.parse_args()  # fmt: skip


def main() -> None:
    args = parse_args()
    if args.rank_report:
        rank_report(args)
        return
    load_before = os.getloadavg()[0]
    import numpy as np

    from hopserve import GraphStore
    from hopserve.worker.distributed.output import read_embeddings

    args.data = f"{args.data}-{args.nodes}-{args.avg_degree:g}-{args.dim}"
    graphs = harness.powerlaw_pair(
        Path(args.data), args.nodes, args.avg_degree, args.dim, seed=args.seed
    )
    scratch = Path(args.data) / "embed_all"
    worlds = [int(w) for w in args.worlds.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in worlds}
    # World sizes interleaved, so that a noisy neighbour hurts them alike.
    for rep in range(args.repeat):
        for world in worlds:
            harness.log(f"{world} rank(s), run {rep + 1}/{args.repeat} …")
            run = run_world(args, graphs["rcmk"], world, scratch / f"rep{rep}")
            s = summarize(run)
            harness.log(
                f"  job {s['job_s']:.2f}s (compute {s['compute_s']:.2f}s, exchange "
                f"{s['exchange_s']:.2f}s, wait {s['wait_s']:.2f}s); launch {s['launch_wall_s']:.1f}s"
            )
            runs[world].append(run | {"summary": s})
    results: dict[int, dict[str, Any]] = {}
    for world, rs in runs.items():
        best = min(rs, key=lambda r: r["summary"]["job_s"])
        results[world] = best["summary"] | {
            "runs_job_s": [round(r["summary"]["job_s"], 3) for r in rs],
            "emb": best["emb"],
        }
    # Exactness: every world's shards against 1 rank's (or the smallest world's).
    ref_world = min(worlds)
    ref_ids, ref_emb, _ = read_embeddings(results[ref_world]["emb"])
    for world, res in results.items():
        ids, emb, meta = read_embeddings(res["emb"])
        if not np.array_equal(ids, ref_ids):
            raise SystemExit(f"{world} ranks wrote other node ids than {ref_world}")
        res["max_abs_diff_vs_1_rank"] = float(np.abs(emb - ref_emb).max())
        res["shards"] = int(meta.get("hopserve.world_size", world))
    # The halo lower bound per layer, counted independently of the job.
    store = GraphStore.open(graphs["rcmk"])
    indptr = np.asarray(store.topology.indptr, dtype=np.int64)
    indices = np.asarray(store.topology.indices, dtype=np.int64)
    n, e = store.num_nodes, store.num_edges
    widths = exchanged_widths(args)
    halo_fraction = {}
    for world in sorted(set(worlds) | {2, 4, 8, args.model_machines}):
        if world > n:
            continue
        lb = halo_lower_bound(indptr, indices, world)
        halo_fraction[world] = sum(lb) / n
        if world not in results:
            continue
        res = results[world]
        res["halo_rows_lower_bound_per_rank"] = lb
        exchanged = [x for x in res["layers"] if x["bytes_received"] or x["bytes_sent"]]
        if world > 1 and len(exchanged) != len(widths):
            raise SystemExit(f"{world} ranks: {len(exchanged)} exchanging blocks, expected "
                             f"{len(widths)} (one per layer output read over sources)")  # fmt: skip
        for layer in res["layers"]:
            layer["bytes_lower_bound"] = 0
        for layer, width in zip(exchanged, widths, strict=False):
            layer["bytes_lower_bound"] = sum(lb) * width * 4
        res["bytes_exchanged"] = sum(x["bytes_received"] for x in res["layers"])
        res["bytes_lower_bound"] = sum(x["bytes_lower_bound"] for x in res["layers"])
    harness.log(f"halo rows / nodes by ranks: {halo_fraction}")
    model = scaling_model(args, results, halo_fraction, n, e)
    load = {"before": load_before, "after": os.getloadavg()[0]}
    report(args, n, e, results, halo_fraction, model, load)


# --------------------------------------------------------------------------- report
def report(
    args: argparse.Namespace,
    n: int,
    e: int,
    results: dict[int, dict[str, Any]],
    halo_fraction: dict[int, float],
    model: dict[str, Any],
    load: dict[str, float],
) -> None:
    """``embed_all.{json,md,png}``."""
    cores = os.cpu_count() or 1
    one = results.get(1)
    machine = harness.machine_line()
    summary = {
        "graph": {"nodes": n, "edges": e, "feature_dim": args.dim, "order": "rcmk"},
        "model": f"GraphSAGE-mean x{args.layers}, hidden {args.hidden}, out {args.out_dim}",
        "machine": machine,
        "git": harness.git_revision(),
        "budget_mb_per_rank": args.budget_mb,
        "load_avg_1m": load,
        "results": results,
        "halo_rows_over_nodes": halo_fraction,
        "scaling_model": model,
    }
    lines = [
        f"# All-node embedding on 1–{max(results)} ranks (`bench/embed_all.py`)",
        "",
        f"{summary['model']}; {n:,} nodes, {e:,} edges, {args.dim}-dim features, RCMK "
        f"order; `torchrun --standalone`, gloo on loopback, one machine ({machine}); "
        f"{args.threads} threads split over the ranks, layer checkpoints off, best of "
        f"{args.repeat} interleaved runs; 1-minute load average {load['before']:.1f} before "
        f"the runs, {load['after']:.1f} after.",
        "",
    ]
    rows = []
    for w, r in sorted(results.items()):
        speed = one["job_s"] / r["job_s"] if one else math.nan
        rows.append([
            w, r["threads_per_rank"], f"{r['job_s']:.2f}", ", ".join(f"{x:.2f}" for x in
            r["runs_job_s"]), f"{speed:.2f}×", f"{r['compute_s']:.2f}", f"{r['exchange_s']:.3f}",
            f"{r['wait_s']:.3f}", f"{r['other_s']:.2f}",
            f"{r['bytes_exchanged'] / 1e6:.1f}", f"{r['bytes_lower_bound'] / 1e6:.1f}",
            " / ".join(f"{m:.0f}" for m in r["peak_rss_mb_per_rank"]),
            f"{r['max_abs_diff_vs_1_rank']:.1e}",
        ])  # fmt: skip
    lines += harness.markdown_table(
        ["ranks", "threads/rank", "job (s)", "runs (s)", "speedup vs 1", "compute (s)",
         "halo transfer (s)", "wait (s)", "setup+write (s)", "MB exchanged",
         "MB lower bound", "peak RSS per rank (MB)", "max abs diff vs 1 rank"],
        rows,
        "rrrlrrrrrrrlr",
    )  # fmt: skip
    minimal = all(
        r["bytes_exchanged"] == r["bytes_lower_bound"] for w, r in results.items() if w > 1
    )
    over = [w for w, r in results.items() if w > cores]
    beyond = [w for w, r in results.items() if one and one["job_s"] / r["job_s"] > cores]
    lines += [
        "",
        f"**Only {cores} cores.** The speedup is bounded by {cores}"
        + (
            f"; {', '.join(map(str, over))} ranks oversubscribe the cores "
            f"({results[max(over)]['threads_per_rank']} thread per rank)"
            if over
            else ""
        )
        + (
            f". Where it exceeds {cores} ({', '.join(map(str, beyond))} ranks), 1 rank's "
            f"{one['threads_per_rank']} intra-op threads use the cores less well than "
            "single-threaded processes (see the compute check at the end), not the ranks "
            "doing less work"
            if beyond
            else ""
        )
        + ". The measurement is for the per-layer costs below "
        "(compute per edge, bytes exchanged, exchange time), which feed the scaling model; "
        "speedups on a bigger machine or a cluster must be measured there. *job* is "
        "`embed_all` on the slowest rank (halo planning, the engine's setup and self-check, "
        "every layer, the Parquet write); compute, transfer and wait are summed over layers "
        "of the per-layer maximum over ranks; *halo transfer* is the `all_to_all` with the "
        "packing of the rows sent and of the received table; *wait* is a barrier the "
        "benchmark puts before each exchange "
        "(the slowest rank's lag: load imbalance and oversubscription).",
        "",
        "**Bytes exchanged vs the halo lower bound.** The lower bound of a layer is the "
        "distinct remote rows each rank must read (in-neighbours of its range owned by "
        "other ranks, counted here from the CSC independently of the job) × the row "
        "width × 4 bytes, summed over ranks. "
        + (
            "The measured bytes equal it exactly at every world size: each remote row is "
            "sent once per rank that reads it, per layer, and nothing else moves (the "
            "halo ids are exchanged once, at planning, and are not counted)."
            if minimal
            else "The measured bytes differ from it (see the per-layer table): the exchange "
            "is not minimal."
        ),
        "",
    ]
    layer_rows = []
    for w, r in sorted(results.items()):
        for x in r["layers"]:
            layer_rows.append([
                w, x["block"], f"{x['compute_s']:.3f}",
                " / ".join(f"{s:.3f}" for s in x["compute_s_per_rank"]),
                f"{x['exchange_s']:.3f}", f"{x['wait_s']:.3f}", f"{x['halo_rows_received']:,}",
                f"{x['bytes_received'] / 1e6:.1f}", f"{x['bytes_lower_bound'] / 1e6:.1f}",
                f"{x['bytes_received'] / x['exchange_s'] / 1e9:.2f}" if x["exchange_s"] > 0
                and x["bytes_received"] else "–",
            ])  # fmt: skip
    lines += harness.markdown_table(
        ["ranks", "block", "compute (s, max)", "compute per rank (s)", "transfer (s)",
         "wait (s)", "halo rows received", "MB exchanged", "MB lower bound",
         "loopback GB/s"],
        layer_rows,
        "rrrlrrrrrr",
    )  # fmt: skip
    halo_line = ", ".join(f"{w} ranks {f:.3f}" for w, f in sorted(halo_fraction.items()))
    lines += [
        "",
        f"Halo rows over all ranks / nodes, this graph's RCMK 1-D partition: {halo_line} "
        "(8 and 16 counted without running the job).",
        "",
    ]
    lines += model_lines(model)
    harness.write_outputs(Path(args.out), "embed_all", summary, lines, lambda p: plot(summary, p))


def model_lines(model: dict[str, Any]) -> list[str]:
    """The scaling model as markdown."""
    t = model["target"]
    p, cores = model["machines"], model["cores_per_machine"]
    per_layer = ", ".join(f"{c:.0f}" for c in model["core_ns_per_edge_per_layer"])
    widths = " + ".join(str(w) for w in model["exchanged_widths"])
    lines = [
        f"## Scaling model (a model, not a measurement): {t['name']} on {p} machines",
        "",
        f"Target: {t['nodes'] / 1e6:.0f}M nodes, {t['edges'] / 1e9:.2f}B edges (average "
        f"in-degree {model['target_degree']:.1f}; measured graph {model['graph_degree']:.0f}), "
        f"{t['dim']}-dim features, the same 3-layer GraphSAGE; {p} machines of {cores} cores, "
        "one rank per machine, no overlap of compute and exchange (as hopserve runs).",
        "",
        f"* **Compute** = edges per machine ({t['edges'] / p / 1e6:.0f}M) × measured "
        f"core-seconds per edge per layer ({per_layer} ns for the {len(model['core_ns_per_edge_per_layer'])} "
        f"blocks, from the {model['reference_world_size']}-rank run, one thread per rank) / "
        f"{cores} cores. Assumes per-core throughput holds on {cores} cores (optimistic: "
        "the aggregation is memory-bound) and that the per-row (dense) work per edge is "
        "the same (optimistic for it: the target has fewer edges per row, so its dense "
        f"share per edge is larger, by up to {model['graph_degree'] / model['target_degree']:.2f}×).",
        f"* **Exchange** = halo rows per machine × ({widths}) float32 per row × 4 bytes, "
        f"summed over the {len(model['exchanged_widths'])} layers that read the previous "
        "layer's output over their sources (layer 0 reads the features from the store, not "
        "the network) / network bandwidth (per machine, full duplex, no latency term). "
        "The halo fraction (halo rows / own rows) "
        "is graph-dependent: *optimistic* takes this synthetic graph's RCMK partition at "
        f"{p} ranks; *pessimistic* draws in-neighbours uniformly (no locality: "
        f"(N − N/P)(1 − e^(−d/P)) rows per machine).",
        "* Left out: reading and partitioning the graph (DEAL's graph construction), loading "
        f"the {t['nodes'] * t['dim'] * 4 / 1e9:.0f} GB of features, the Parquet write, "
        "stragglers.",
        "",
    ]
    rows = []
    for s in model["scenarios"]:
        rows.append([
            s["halo"], f"{s['halo_fraction']:.2f}", f"{s['bandwidth_gbps']:g} Gb/s",
            f"{s['compute_s']:.1f}", f"{s['exchange_s']:.1f}", f"{s['halo_gb_per_machine']:.1f}",
            f"{s['total_s']:.1f}", f"{s['edges_per_s'] / 1e6:.0f}M",
        ])  # fmt: skip
    lines += harness.markdown_table(
        ["halo", "halo / own rows", "network", "compute (s)", "exchange (s)",
         "halo GB per machine", "model total (s)", "graph edges / s"],
        rows,
        "lrrrrrrr",
    )  # fmt: skip
    best = min(s["total_s"] for s in model["scenarios"])
    worst = max(s["total_s"] for s in model["scenarios"])
    measured = ", ".join(
        f"{w} rank(s) {v / 1e6:.1f}M" for w, v in sorted(model["measured_edges_per_s"].items())
    )
    lines += [
        "",
        "Against what is reported (different models, hardware and networks; the hopserve "
        "rows are the model above):",
        "",
    ]
    lines += harness.markdown_table(
        ["system", "graph", "machines", "time", "graph edges / s", "source"],
        [
            ["hopserve (model)", f"{t['name']}, GraphSAGE x3", f"{p} × {cores} cores",
             f"{best:.0f}–{worst:.0f} s GNN compute + exchange",
             f"{t['edges'] / worst / 1e6:.0f}M–{t['edges'] / best / 1e6:.0f}M", "this model"],
            ["hopserve (measured)",
             f"{model['graph_nodes'] / 1e3:.0f}K nodes / {model['graph_edges'] / 1e6:.1f}M edges",
             f"1 × {model['measured_cores']} cores",
             "see above", measured, "this run"],
            ["DEAL", "ogbn-papers100M, GCN / GAT x3 (fanout 50)", "16 × r5.16xlarge, 25 Gb/s",
             "3.25× / 3.90× faster than DGI (2.3–7.7× over its datasets)", "not in the text",
             "DEAL §4.2 (Fig. 14)"],
            ["InferTurbo", "~10^11 edges", "a cluster", "< 2 h",
             f"> {model['inferturbo_edges_per_s'] / 1e6:.0f}M", "as cited in issue 13"],
        ],
        "llllll",
    )  # fmt: skip
    lines += [
        "",
        f"Strong scaling in the model, 2 → {p} machines (DEAL Fig. 15(d), ogbn-papers100M: "
        "3.98× for GCN, 4.83× for GAT from 2 to 16 machines, measured):",
        "",
    ]
    lines += harness.markdown_table(
        ["halo", "network", "model, 2 machines (s)", f"model, {p} machines (s)", "speedup"],
        [[s["halo"], f"{s['bandwidth_gbps']:g} Gb/s", f"{s['total_2_s']:.1f}",
          f"{s['total_p_s']:.1f}", f"{s['speedup']:.2f}×"]
         for s in model["strong_scaling_from_2"]],
        "llrrr",
    )  # fmt: skip
    ratios = [s["exchange_s"] / s["compute_s"] for s in model["scenarios"]]
    mem = model["halo_gb_per_machine_per_layer"]
    lines += [
        "",
        f"In this model the exchange takes {min(ratios):.1f}–{max(ratios):.1f}× the compute "
        "time"
        + (
            ": at this scale the network and the partition's locality decide the time, not "
            "the per-edge compute. "
            if min(ratios) > 1
            else ". "
        )
        + "Overlapping the two (DEAL's pipelining) would save at most the smaller. "
        "A received halo holds "
        + " and ".join(f"{v:.0f} GB ({k.split(' ')[0]})" for k, v in mem.items())
        + f" per machine and exchanged layer, beside its own "
        f"{t['nodes'] / p * 1024 / 1e9:.0f} GB of rows: memory, not "
        "time, may bound the pessimistic case.",
        "",
        "The model's compute term checked on the measured world sizes (same core-seconds "
        "per edge, over the cores each rank had, for the rank with the most edges):",
        "",
    ]
    lines += harness.markdown_table(
        ["ranks", "cores per rank", "model compute (s)", "measured compute (s)", "measured / model"],
        [[c["world_size"], f"{c['cores_per_rank']:g}", f"{c['predicted_compute_s']:.2f}",
          f"{c['measured_compute_s']:.2f}",
          f"{c['measured_compute_s'] / c['predicted_compute_s']:.2f}"]
         for c in model["compute_check"]],
        "rrrrr",
    )  # fmt: skip
    lines += [
        "",
        "The exchange term is checked only in its bytes (halo rows × width: equal to the "
        "measured bytes above); the loopback transfer rates above are no guide to a "
        "network's, so its seconds are the assumed bandwidth's.",
    ]
    return lines


def plot(summary: dict[str, Any], path: Path) -> None:
    """Time per world size split into compute, transfer, wait and the rest; bytes
    exchanged per layer vs the lower bound."""
    plt = harness.pyplot()
    results = {int(k): v for k, v in summary["results"].items()}
    worlds = sorted(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    parts = [("compute_s", "compute", "#2b7bba"), ("exchange_s", "halo transfer", "#d95f02"),
             ("wait_s", "wait (slowest rank)", "#fdb863"), ("other_s", "setup + write", "#bbbbbb")]  # fmt: skip
    bottom = [0.0] * len(worlds)
    labels = [str(w) for w in worlds]
    for key, label, color in parts:
        vals = [results[w][key] for w in worlds]
        ax1.bar(labels, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, w in enumerate(worlds):
        ax1.text(i, bottom[i], f"{results[w]['job_s']:.2f}s", ha="center", va="bottom", fontsize=8)
    ax1.set_xlabel(f"ranks ({summary['scaling_model']['measured_cores']} cores)")
    ax1.set_ylabel("seconds (slowest rank)")
    ax1.set_title("embed_all time per world size")
    ax1.legend(fontsize=7)
    xs, measured, bound = [], [], []
    for w in worlds:
        for x in results[w]["layers"]:
            if x["bytes_lower_bound"] or x["bytes_received"]:
                xs.append(f"{w}r b{x['block']}")
                measured.append(x["bytes_received"] / 1e6)
                bound.append(x["bytes_lower_bound"] / 1e6)
    pos = list(range(len(xs)))
    ax2.bar([p - 0.2 for p in pos], measured, width=0.4, label="exchanged", color="#d95f02")
    ax2.bar([p + 0.2 for p in pos], bound, width=0.4, label="halo lower bound", color="#999999")
    ax2.set_xticks(pos, xs, fontsize=8)
    ax2.set_ylabel("MB per layer (all ranks)")
    ax2.set_title("bytes exchanged vs lower bound")
    ax2.legend(fontsize=7)
    harness.save_figure(fig, path)


if __name__ == "__main__":
    main()
