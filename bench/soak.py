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

This file holds the command line and the top-level flow; the parts are in ``bench/soak_parts/``
(load generation and checking, the run and its phases, analysis, markdown, plot).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402 - bench/ is not a package
from soak_parts.analysis import analyze  # noqa: E402
from soak_parts.common import log  # noqa: E402
from soak_parts.markdown import markdown  # noqa: E402
from soak_parts.plot import plot  # noqa: E402
from soak_parts.run import Soak  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = harness.parser(__doc__)
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
            log(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    lines = markdown(summary, f"{prefix}.png")
    harness.write_outputs(out, prefix, summary, lines, lambda path: plot(path, summary))
    log(
        f"wrote {out / prefix}.{{json,md,png}} in {summary['wall_s']:.0f} s; goals "
        f"{'met' if summary['goals_met'] else 'NOT met'}"
    )
    for goal in summary["goals"]:
        log(f"  [{'met' if goal['met'] else 'NOT MET'}] {goal['goal']}: {goal['measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
