"""What the soak's parts share: the run's constants, progress lines, status codes, formats."""

from __future__ import annotations

import math
from collections.abc import Mapping

import harness

MODEL = "sage"
SOURCES = ("load", "checker", "drain")  # record "source" 0, 1, 2: who sent the request
LOAD, CHECKER, DRAIN = range(len(SOURCES))
GRACE_S = 10.0  # the front-end's server.grace_period_s (its default, written explicitly)
CLIENT_ERROR = -1  # record.code of a failure that is not a gRPC status

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


def log(message: str) -> None:
    """A progress line on stderr, ``[soak +12.3s] ...``."""
    harness.log(message, prefix="soak")


def code_of(err: BaseException) -> int:
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


def num(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``; ``-`` for None and NaN."""
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def fmt_codes(codes: Mapping[str, int]) -> str:
    """``{"UNAVAILABLE": 3, "OK": 9}`` as ``"OK 9, UNAVAILABLE 3"``."""
    return ", ".join(f"{k} {v}" for k, v in sorted(codes.items()))


def md_escape(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
