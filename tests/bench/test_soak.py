"""``bench/soak.py --quick``: the real service (Redis, a remote worker, the front-end) under
open-loop load while Redis and the worker are SIGKILLed and restarted and the front-end gets
SIGTERM. Asserts only the goals that do not depend on timing (a loaded 2-core CI box): no
wrong row, no error outside the worker-down window, UNAVAILABLE only inside it (both but
documented load shedding, see ``OVERLOAD``), exit 0 after SIGTERM. Latency, throughput,
recovery time, RSS growth and the drain of in-flight requests are reported by the run
(``soak-quick.md``, goals met / not met), not asserted.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The one error code tolerated anywhere: the front-end's documented load shedding (its batcher
# queue holds at most server.max_queue requests; beyond, RESOURCE_EXHAUSTED, which clients
# retry with backoff). The open loop runs at 0.8 x a max measured over 4 s, and on a shared
# CI box a descheduled load generator or front-end turns into a burst of a few hundred
# requests at once: shedding part of such a burst is the service working as documented, not a
# fault-handling error. Every other code outside the worker-down window fails the test.
OVERLOAD = {"RESOURCE_EXHAUSTED"}

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "bench" / "soak.py"
RUN_TIMEOUT_S = 720  # the quick run takes 75-110 s on a loaded 2-core machine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the quick soak once for the module; its ``soak-quick.json`` plus the console."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    out = tmp_path_factory.mktemp("soak")
    proc = subprocess.Popen(
        [sys.executable, str(SOAK), "--quick", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        console, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the script stops its processes on SIGTERM
        try:
            console, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            console, _ = proc.communicate()
        pytest.fail(f"soak --quick did not finish in {RUN_TIMEOUT_S} s:\n{console[-6000:]}")
    assert proc.returncode == 0, f"soak --quick failed:\n{console[-6000:]}"
    summary = json.loads((out / "soak-quick.json").read_text())
    summary["_out"] = out
    summary["_console"] = console
    return summary


def _context(s: dict[str, Any]) -> str:
    """What to print when an assertion fails: per-phase errors, windows, front-end warnings."""
    phases = {p["phase"]: (p["errors"], p["server_outcomes"]) for p in s["phases"]}
    warnings = s["logs"].get("front-end", {}).get("warnings", [])[:6]
    return json.dumps(
        {
            "events": s["events"],
            "phases (client errors, front-end outcomes)": phases,
            "worker": s["worker"],
            "shutdown": s["shutdown"],
            "front-end warnings": warnings,
        },
        indent=1,
    )


def test_writes_the_report(soak: dict[str, Any]) -> None:
    for suffix in ("json", "md", "png"):
        assert (soak["_out"] / f"soak-quick.{suffix}").stat().st_size > 0
    assert [p["phase"] for p in soak["phases"]] == [
        "warmup",
        "steady",
        "redis",
        "worker",
        "steady-2",
        "shutdown",
    ]
    assert soak["load"]["tally"]["ok"] > 0, _context(soak)


def test_no_wrong_rows(soak: dict[str, Any]) -> None:
    checker = soak["checker"]
    assert checker["samples"] > 0, "the checker compared nothing"
    assert soak["wrong_rows_total"] == 0, _context(soak) + json.dumps(checker["first_wrong"])
    assert soak["graph"]["engine_vs_forward_wrong_rows"] == 0


def test_no_errors_outside_the_worker_down_window(soak: dict[str, Any]) -> None:
    # Redis down must not fail requests (the cache degrades to misses); no deadline, cancel
    # or internal errors either. Requests in flight at SIGTERM are judged by the shutdown.
    errors = soak["errors_outside_window"]
    assert set(errors) <= OVERLOAD, _context(soak)


def test_worker_down_window_answers_unavailable_only(soak: dict[str, Any]) -> None:
    # Requests that need the dead worker fail fast with UNAVAILABLE (retryable), nothing else.
    errors = soak["worker"]["errors_in_window"]
    assert "UNAVAILABLE" in errors, "no request failed while the worker was down"
    assert set(errors) <= {"UNAVAILABLE"} | OVERLOAD, _context(soak)


def test_frontend_exits_0_after_sigterm(soak: dict[str, Any]) -> None:
    assert soak["shutdown"]["exit_code"] == 0, _context(soak)
