"""Command-line options the benchmark scripts share (same flags, defaults and help), and the
evaluator options they turn into."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .report import REPO, RESULTS

POWERLAW_DATA = REPO / "data" / "bench-powerlaw"
"""Default ``--data`` of the engine benchmarks (they share the graph files)."""


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by the first line of ``doc`` (a script's docstring)."""
    return argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)


def add_graph_args(
    p: argparse.ArgumentParser, *, nodes: int, avg_degree: float, dim: int | None = None
) -> None:
    """``--nodes``, ``--avg-degree`` and (when ``dim`` is given) ``--dim``: the synthetic
    power-law graph's sizes."""
    p.add_argument("--nodes", type=int, default=nodes)
    p.add_argument("--avg-degree", type=float, default=avg_degree)
    if dim is not None:
        p.add_argument("--dim", type=int, default=dim)


def add_model_args(p: argparse.ArgumentParser, *, hidden: int, out_dim: int = 64) -> None:
    """``--hidden`` and ``--out-dim``: the benchmark model's widths."""
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--out-dim", type=int, default=out_dim)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--threads`` and ``--budget-mb``: how the evaluator runs."""
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--budget-mb", type=int, default=64, help="hopserve CPU batch budget")


def add_allocator_arg(p: argparse.ArgumentParser) -> None:
    """``--allocator``: the C allocator of the child runs (the worker images preload
    tcmalloc, ``worker/runtime/allocator.py``; ``system`` is glibc malloc)."""
    from hopserve.worker.runtime.allocator import find_tcmalloc

    p.add_argument(
        "--allocator",
        choices=("tcmalloc", "system"),
        default="tcmalloc" if find_tcmalloc() else "system",
        help="tcmalloc (default where libtcmalloc-minimal4 is installed) or glibc malloc",
    )


def child_env(args: argparse.Namespace, **extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with tcmalloc preloaded when
    ``args.allocator`` says so (see :func:`add_allocator_arg`)."""
    from hopserve.worker.runtime.allocator import find_tcmalloc, with_tcmalloc

    env = dict(os.environ, **extra)
    if args.allocator == "system":
        env.pop("LD_PRELOAD", None)
        return env
    if find_tcmalloc() is None:
        raise SystemExit("--allocator tcmalloc: libtcmalloc_minimal is not installed")
    return with_tcmalloc(env)


def measured_allocators(results: Iterable[dict[str, Any]]) -> str:
    """The allocators child runs measured (``allocator`` in their results; runs from
    before ``--allocator`` ran under glibc), joined with ``/``."""
    return "/".join(sorted({res.get("allocator", "glibc") for res in results}))


def evaluator_options(args: argparse.Namespace) -> dict[str, Any]:
    """``LayerwiseEvaluator`` keyword arguments from :func:`add_engine_args`' options:
    ``args.device``, a CPU batch budget of ``args.budget_mb`` MiB (a GPU sizes its batches
    from its free memory), no progress bars."""
    budget = args.budget_mb << 20 if args.device == "cpu" else None
    return {"device": args.device, "progress": False, "memory_budget_bytes": budget}


def add_load_args(p: argparse.ArgumentParser, *, duration: float = 10.0) -> None:
    """``hopserve loadtest``'s closed-loop workload: concurrency, durations, set sizes,
    Zipf popularity (see :func:`load_spec`)."""
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=duration)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--set-size", type=int, default=16)
    p.add_argument("--set-size-sigma", type=float, default=0.5)
    p.add_argument("--zipf", type=float, default=1.1)


def load_spec(args: argparse.Namespace, model: str, seed: int = 1) -> Any:
    """The ``hopserve.client.loadtest.LoadSpec`` of :func:`add_load_args`' options."""
    from hopserve.client.loadtest import LoadSpec

    return LoadSpec(
        model=model,
        concurrency=args.concurrency,
        duration_s=args.duration,
        warmup_s=args.warmup,
        set_size=args.set_size,
        set_size_sigma=args.set_size_sigma,
        zipf_a=args.zipf,
        seed=seed,
    )


def add_io_args(p: argparse.ArgumentParser, *, data: str | Path = POWERLAW_DATA) -> None:
    """``--data`` (inputs, built once and reused) and ``--out`` (results, default
    ``bench/results``)."""
    p.add_argument("--data", default=str(data))
    p.add_argument("--out", default=str(RESULTS))


def add_child_args(p: argparse.ArgumentParser, *names: str, **typed: type) -> None:
    """Hidden options a script passes to its own child runs: ``names`` as strings,
    ``typed`` (``num_layers=int``) converted."""
    for name in names:
        p.add_argument(f"--{name.replace('_', '-')}", help=argparse.SUPPRESS)
    for name, kind in typed.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=argparse.SUPPRESS)
