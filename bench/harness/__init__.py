"""Reusable plumbing for the benchmarks in ``bench/`` (not imported by the service).

What every benchmark script needs, once (``import harness`` gives all of it):

* :mod:`.cli` — the options the scripts share (graph and model sizes, engine,
  ``--data``/``--out``, hidden options of child runs) and :func:`evaluator_options` (the
  evaluator they configure);
* :mod:`.data` — :func:`prepare_sage` (a power-law graph store and seeded GraphSAGE weights,
  built once per size), :func:`powerlaw_pair` (one graph, as generated and RCMK-ordered),
  :func:`model_entry` / :func:`write_config` (a ``hopserve`` YAML file);
* :mod:`.procs` — :class:`ServiceProcess` (``python -m hopserve ...`` with a log file,
  restartable), :func:`start_frontend` / :func:`start_worker` (SERVING on gRPC health), and
  one-measurement children (:func:`script_command`, :func:`run_child`, :func:`emit_result`).
  Ports and Redis come from :mod:`hopserve.testing` (``free_port``, ``wait_for_port``,
  ``RedisServer``), re-exported here so scripts import one module;
* :mod:`.sample` — :func:`timed`, :func:`run_stats`, :func:`stage_seconds`, :func:`percentiles`,
  :func:`memory_model_mb` (the 1.3× memory goal's reference),
  RSS of this process, :class:`RssSampler` and :class:`MetricsScraper` (threads);
* :mod:`.report` — paths, :func:`log`, :func:`machine_info` / :func:`machine_line`,
  :func:`git_revision`, :func:`write_json`, :func:`markdown_table`, :func:`write_outputs`;
* :mod:`.plot` — :func:`pyplot` (Agg), :func:`save_figure`, :func:`shade_spans`,
  :func:`mark_events`.

Heavy modules (torch, matplotlib, grpc health stubs, psutil) are imported inside the
functions that need them, so importing the package is cheap (benchmarks spawn children
that re-import it).
"""

from hopserve.testing import RedisServer, free_port, wait_for_port

from .cli import (
    POWERLAW_DATA,
    add_allocator_arg,
    add_child_args,
    add_engine_args,
    add_graph_args,
    add_io_args,
    add_load_args,
    add_model_args,
    child_env,
    evaluator_options,
    load_spec,
    measured_allocators,
    parser,
)
from .data import SageData, model_entry, powerlaw_pair, prepare_sage, write_config
from .plot import mark_events, pyplot, save_figure, shade_spans
from .procs import (
    ServiceProcess,
    emit_result,
    grpc_health,
    run_child,
    script_command,
    start_frontend,
    start_worker,
    wait_serving,
)
from .report import (
    BENCH,
    REPO,
    RESULTS,
    git_revision,
    log,
    machine_info,
    machine_line,
    markdown_table,
    to_jsonable,
    write_json,
    write_lines,
    write_outputs,
)
from .sample import (
    MetricsScraper,
    RssSampler,
    cached_lookups,
    current_rss_mb,
    memory_model_mb,
    peak_rss_mb,
    percentiles,
    run_stats,
    stage_seconds,
    timed,
)

__all__ = [
    "memory_model_mb",
    "BENCH",
    "POWERLAW_DATA",
    "REPO",
    "RESULTS",
    "MetricsScraper",
    "RedisServer",
    "RssSampler",
    "SageData",
    "ServiceProcess",
    "add_child_args",
    "add_allocator_arg",
    "add_engine_args",
    "add_graph_args",
    "add_io_args",
    "add_load_args",
    "add_model_args",
    "cached_lookups",
    "current_rss_mb",
    "emit_result",
    "evaluator_options",
    "free_port",
    "git_revision",
    "grpc_health",
    "load_spec",
    "measured_allocators",
    "log",
    "machine_info",
    "machine_line",
    "mark_events",
    "markdown_table",
    "model_entry",
    "parser",
    "peak_rss_mb",
    "percentiles",
    "powerlaw_pair",
    "prepare_sage",
    "pyplot",
    "child_env",
    "run_child",
    "run_stats",
    "save_figure",
    "script_command",
    "shade_spans",
    "stage_seconds",
    "start_frontend",
    "start_worker",
    "timed",
    "to_jsonable",
    "wait_for_port",
    "wait_serving",
    "write_config",
    "write_json",
    "write_lines",
    "write_outputs",
]
