"""Graph updates on a living service: update throughput, staleness, invalidation, hit ratios.

The real service (``hopserve serve`` in a subprocess, its in-process worker, a Redis cache
on a private ``redis-server``) serves a 2-layer GraphSAGE and a 2-layer GCN on one
synthetic power-law graph (1M nodes / 10M edges by default, built once under ``--data``).
This process is the client: an open-loop query stream at a fixed rate, an updater sending
edge mutations through ``AdminClient.update_graph``, and a read-your-writes checker.

Four configurations run one after the other, each on a fresh copy of the same base graph,
with the same query stream and the same update stream (``updates_parts/service.py``):
``exact`` (``cache.invalidation: exact``), ``refresh`` (exact + ``refresh_hot_rows``),
``flush`` (``cache.invalidation: flush``) and ``none`` (``cache.backend: none``). Each runs
phases that replay the same stream: ``idle`` (no updates), then updates at ``--rates``
mutations/s, then (``exact``, ``none``) ``max``: batches of ``--max-batch`` back to back,
the sustained throughput. ``exact`` also measures cold start (requests for nodes just
added) and one-edge updates touching the hubs. Before the services, the parts of one
update (splice, log fsync, invalidation) and GCN's per-sequence normalization are timed
in this process (``updates_parts/cost.py``).

Outputs ``updates.{json,md,png}`` in ``--out`` (``bench/results``; ``--quick``: a temp dir
and ``updates-quick.*``).

    python bench/updates.py                        # 1M nodes / 10M edges, ~20 min on 2 cores
    python bench/updates.py --nodes 200000 --edges 2000000 --duration 20
    python bench/updates.py --quick                # 50K nodes, < 1 min: the smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402 - bench/ is not a package
import numpy as np  # noqa: E402
from updates_parts import phases as ph  # noqa: E402
from updates_parts.cost import update_cost  # noqa: E402
from updates_parts.report import goals, markdown, plot  # noqa: E402
from updates_parts.service import CONFIGS, Service, prepare  # noqa: E402
from updates_parts.streams import GraphView, UpdateSource, probe_nodes, query_stream  # noqa: E402

log = ph.log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = harness.parser(__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 50K nodes, short phases, fewer phases, temp output",
    )
    p.add_argument("--nodes", type=int, default=None, help="graph nodes (1M; quick 50K)")
    p.add_argument("--edges", type=int, default=None, help="graph edges (10M; quick 500K)")
    p.add_argument("--dim", type=int, default=64, help="feature width")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--out-dim", type=int, default=32)
    p.add_argument(
        "--duration", type=float, default=None, help="seconds per measured phase (40; quick 2)"
    )
    p.add_argument("--rate", type=float, default=10.0, help="queries/s (open loop)")
    p.add_argument("--set-size", type=int, default=16, help="targets per request")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--hot-keys", type=int, default=256)
    p.add_argument("--hot-fraction", type=float, default=0.2)
    p.add_argument(
        "--rates",
        default=None,
        help="update rates (mutations/s) of the rate phases (10,100,1000; quick 100)",
    )
    p.add_argument(
        "--refresh-rate",
        type=float,
        default=100.0,
        help="the update rate of the refresh configuration's phase",
    )
    p.add_argument(
        "--batch-interval",
        type=float,
        default=0.1,
        help="seconds between batches in the rate phases",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="mutations per batch in the max phase (20000; quick 2000)",
    )
    p.add_argument(
        "--goal-rate",
        type=float,
        default=20_000.0,
        help="mutations/s of the goal phase (query p99 measured against idle; 0 = skip)",
    )
    p.add_argument(
        "--goal-interval",
        type=float,
        default=0.5,
        help="seconds between batches in the goal phase",
    )
    p.add_argument("--configs", default=",".join(CONFIGS), help="configurations to run")
    p.add_argument(
        "--no-max", dest="max_phase", action="store_false", help="skip the max-throughput phase"
    )
    p.add_argument(
        "--no-cost",
        dest="cost",
        action="store_false",
        help="skip the in-process timing of an update's parts",
    )
    p.add_argument("--cost-reps", type=int, default=3)
    p.add_argument("--cold-reps", type=int, default=None, help="cold-start batches (20; quick 2)")
    p.add_argument("--probes", type=int, default=64, help="checker probe nodes")
    p.add_argument(
        "--check-every",
        type=int,
        default=4,
        help="compare every n-th checker answer with a recomputation",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="client deadline per query (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="graph/weights cache (data/; quick: temp)")
    p.add_argument("--out", default=None, help="output folder (bench/results; quick: temp)")
    p.add_argument("--keep-work", action="store_true", help="keep the work dir (server logs)")
    p.add_argument(
        "--render",
        metavar="JSON",
        default=None,
        help="measure nothing: write the .md and .png again from a run's .json (beside it)",
    )
    p.add_argument(
        "--notes",
        metavar="FILE",
        default=None,
        help="observations for the report, one per paragraph (with --render or a run)",
    )
    args = p.parse_args(argv)
    q = args.quick
    defaults = {
        "nodes": 50_000 if q else 1_000_000,
        "edges": 500_000 if q else 10_000_000,
        "duration": 2.0 if q else 40.0,
        "rates": "100" if q else "10,100,1000",
        "max_batch": 2_000 if q else 20_000,
        "cold_reps": 2 if q else 20,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.rate_list = [float(x) for x in args.rates.split(",") if x.strip()]
    args.config_list = [x.strip() for x in args.configs.split(",") if x.strip()]
    unknown = set(args.config_list) - set(CONFIGS)
    if unknown:
        p.error(f"unknown configuration(s) {sorted(unknown)}; known: {', '.join(CONFIGS)}")
    return args


def phase_specs(name: str, args: argparse.Namespace) -> list[ph.PhaseSpec]:
    """The phases of configuration ``name``: idle, the rate phases, and (``exact``,
    ``none``) the goal rate and max. ``--quick`` runs no rate phase without a cache."""
    iv = args.batch_interval
    specs = [ph.PhaseSpec("idle", 0.0, iv)]
    rates = [args.refresh_rate] if name == "refresh" else args.rate_list
    if name == "none" and args.quick:
        rates = []
    specs += [ph.PhaseSpec(f"{r:g}/s", r, iv) for r in rates]
    if name in ("exact", "none"):
        if args.goal_rate:
            specs.append(ph.PhaseSpec("goal", args.goal_rate, args.goal_interval))
        if args.max_phase:
            specs.append(ph.PhaseSpec("max", math.inf, iv))
    return specs


async def run_config(
    name: str,
    service: Service,
    args: argparse.Namespace,
    view: GraphView,
    stream: list,
    hot: np.ndarray,
    probes: list,
    hubs: dict[str, Any],
) -> dict[str, Any]:
    """Warm-up, the phases, and (``exact``) cold start and hub updates."""
    from hopserve.client import AsyncAdminClient, AsyncEmbeddingClient

    async with (
        AsyncEmbeddingClient(service.target, timeout=args.timeout, max_retries=0) as emb,
        AsyncAdminClient(service.target, timeout=120, max_retries=0) as admin,
    ):
        ctx = ph.Context(
            config=name, service=service, emb=emb, admin=admin, view=view, stream=stream,
            hot=hot, probes=probes, source=UpdateSource(view, probes, args.seed),
            cached=CONFIGS[name] is not None, duration=args.duration, timeout=args.timeout,
            max_batch=args.max_batch,
            check_every=args.check_every, progress_every=5.0 if not args.quick else 1.0,
        )  # fmt: skip
        out: dict[str, Any] = {"start_s": service.start_s}
        log(f"{name}: serving after {service.start_s:.1f} s; warming up")
        out["warm_up"] = await ph.warm_up(ctx)
        log(f"{name}: warm-up {out['warm_up']}")
        out["phases"] = {}
        for spec in phase_specs(name, args):
            result = await ph.run_phase(ctx, spec)
            out["phases"][spec.name] = result
            q, u = result["queries"], result.get("updates")
            log(
                f"{name}/{spec.name}: queries p50 {q['p50_ms']:.1f} p99 {q['p99_ms']:.1f} ms, "
                f"hit ratio {q['hit_ratio']:.2f} (hot {q['hot_hit_ratio']:.2f}), errors "
                f"{q['errors'] or 0}"
                + (f"; {u['mutations_per_s']:,.0f} mutations/s in {u['batches']} batches, "
                   f"rows invalidated p50 {u['rows_invalidated']['p50']:,.0f}, checker "
                   f"{result['checker']['checks']} checks, {result['checker']['stale']} stale, "
                   f"{result['checker']['wrong_rows']} wrong" if u else "")
            )  # fmt: skip
        if name == "exact":
            log(f"{name}: cold start")
            out["cold_start"] = await ph.cold_start(ctx, args.cold_reps, args.set_size, 8)
            log(f"{name}: hub updates")
            out["hubs"] = await ph.hub_updates(ctx, hubs)
        return out


def model_swap_note() -> str:
    """The model hot-swap measurement: ``bench/model_swap.py``'s (another benchmark), quoted
    from its results when they exist."""
    import json

    path = harness.RESULTS / "model_swap.json"
    if path.exists():
        try:
            d = json.loads(path.read_text())
            t, a = d["total"], d["args"]
            swaps = ", ".join(f"{s['load_s']:.2f}" for s in d["swaps"])
            return (
                f"Measured by `bench/model_swap.py`, not repeated here (its own run, "
                f"revision {str((d.get('revision') or {}).get('commit', '?'))[:10]}): "
                f"{a['swaps']} swaps (LoadModel "
                f"of the next version as default, UnloadModel of the old) under {a['rate']:g} "
                f"requests/s on a {a['nodes']:,}-node graph: {t['failed']} failed and "
                f"{t['wrong_version_rows']} wrong-version answers of {t['requests']:,}; "
                f"LoadModel {swaps} s; p99 {t['p99_ms']:.0f} ms overall, worst 0.5 s p99 "
                f"{t['worst_bin_p99_ms']:.0f} ms. See [model_swap.md](model_swap.md)."
            )
        except (KeyError, TypeError, ValueError):
            pass
    if (harness.BENCH / "model_swap.py").exists():
        return "Measured by `bench/model_swap.py` (its results: `bench/results/model_swap.md`)."
    return "Not measured here: `bench/model_swap.py` did not exist when this ran."


def read_notes(path: str | None) -> list[str]:
    """Observations from a text file: paragraphs separated by blank lines."""
    if not path:
        return []
    text = Path(path).read_text()
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def render(json_path: Path, notes: list[str]) -> int:
    """Write the report and the figure again from a run's summary (and new notes)."""
    import json

    summary = revive(json.loads(json_path.read_text()))
    if notes:
        summary["observations"] = notes
    summary["goals"] = goals(summary)
    prefix = json_path.stem
    lines = markdown(summary, f"{prefix}.png")
    harness.write_outputs(json_path.parent, prefix, summary, lines, lambda p: plot(p, summary))
    return 0


def revive(obj: Any, key: str = "") -> Any:
    """A summary read back from JSON: ``null`` numbers are NaN again (``max`` phases'
    update rate: infinity), except where ``None`` is meant."""
    if isinstance(obj, dict):
        out = {k: revive(v, k) for k, v in obj.items()}
        if "update_rate" in out and math.isnan(out["update_rate"]):
            out["update_rate"] = math.inf
        return out
    if isinstance(obj, list):
        return [revive(v, key) for v in obj]
    if obj is None and key not in ("quiet", "met", "last_seq", "cold_start"):
        return math.nan
    return obj


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(Path(args.render), read_notes(args.notes))
    started = time.monotonic()
    revision_start = harness.git_revision()

    def on_sigterm(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # runs the clean-up below

    signal.signal(signal.SIGTERM, on_sigterm)
    prefix = "updates-quick" if args.quick else "updates"
    work = Path(tempfile.mkdtemp(prefix="hopserve-updates-"))
    if args.out is not None:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="hopserve-updates-quick-"))
    else:
        out = harness.RESULTS
    data_dir = Path(args.data) if args.data else (
        work / "data" if args.quick else harness.REPO / "data"
    )  # fmt: skip
    summary: dict[str, Any] = {"configs": {}}
    try:
        t = time.monotonic()
        avg_degree = args.edges / args.nodes
        data = prepare(data_dir, args.nodes, avg_degree, args.dim, args.hidden, args.out_dim,
                       args.seed)  # fmt: skip
        view = GraphView(data.graph)
        hubs = view.hubs()
        log(f"graph {view.num_nodes:,} nodes / {view.num_edges:,} edges ready in "
            f"{time.monotonic() - t:.1f} s (hubs: {hubs})")  # fmt: skip
        stream, hot = query_stream(
            view, rate=args.rate, duration=args.duration, set_size=args.set_size,
            zipf=args.zipf, hot_keys=args.hot_keys, hot_fraction=args.hot_fraction,
            seed=args.seed,
        )  # fmt: skip
        targets = np.concatenate([r.ids for r in stream] + [hot])
        probes = probe_nodes(view, targets, args.probes, args.seed)
        log(f"query stream: {len(stream)} requests, {np.unique(targets).size:,} distinct "
            f"targets; {len(probes)} probes")  # fmt: skip
        if args.cost:
            sizes = (1, 100, 1000, 2000) if args.quick else (1, 100, 1000, 10_000, 50_000)
            summary["cost"] = update_cost(
                data.graph, work, sizes, args.cost_reps, hubs, args.hidden
            )
            shutil.rmtree(work / "cost-graph", ignore_errors=True)
        redis = harness.RedisServer.launch(work / "redis", maxmemory="2gb")
        try:
            for name in args.config_list:
                with Service(name, work, data, redis) as service:
                    try:
                        summary["configs"][name] = asyncio.run(
                            run_config(name, service, args, view, stream, hot, probes, hubs)
                        )
                    except BaseException:
                        log(f"{name} failed; front-end log tail:\n{service.proc.log_tail(60)}")
                        raise
        finally:
            redis.stop()
    finally:
        if args.keep_work:
            log(f"work dir kept: {work}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(work, ignore_errors=True)
    info = harness.machine_info()
    summary.update({
        "graph": {"nodes": view.num_nodes, "edges": view.num_edges, "dim": args.dim,
                  "hidden": args.hidden, "out_dim": args.out_dim, "hubs": hubs},
        "machine": info,
        "machine_line": harness.machine_line(info),
        "load_note": f" (1-minute load average {info.get('load_avg_1m', '?')} at the end)",
        "revision": harness.git_revision(),
        "revision_start": revision_start,
        "code": str(Path(__import__("hopserve").__file__).resolve().parent.parent),
        "load": {"rate": args.rate, "set_size": args.set_size, "zipf": args.zipf,
                 "hot_keys": args.hot_keys, "hot_fraction": args.hot_fraction,
                 "duration_s": args.duration, "requests": len(stream),
                 "timeout_s": args.timeout},
        "updates": {"batch_interval_s": args.batch_interval, "max_batch": args.max_batch,
                    "goal_rate": args.goal_rate, "goal_interval_s": args.goal_interval,
                    "remove_fraction": 0.1, "probes": len(probes), "rates": args.rate_list},
        "refresh_phase": f"{args.refresh_rate:g}/s",
        "check_every": args.check_every,
        "cost_reps": args.cost_reps,
        "model_swap": model_swap_note(),
        "command": "python bench/updates.py " + " ".join(map(shlex.quote, argv or sys.argv[1:])),
        "wall_s": time.monotonic() - started,
        "observations": read_notes(args.notes),
    })  # fmt: skip
    summary["goals"] = goals(summary)
    lines = markdown(summary, f"{prefix}.png")
    harness.write_outputs(out, prefix, summary, lines, lambda path: plot(path, summary))
    log(f"wrote {out / prefix}.{{json,md,png}} in {summary['wall_s']:.0f} s")
    for goal in summary["goals"]:
        met = {True: "met", False: "NOT MET", None: "not measured"}[goal["met"]]
        log(f"  [{met}] {goal['goal']}: {goal['measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
