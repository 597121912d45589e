"""``server.local_workers``: the front-end starts worker processes and supervises them.

Real processes throughout: two ``hopserve worker`` children on Unix sockets in a private
directory, the front-end's dispatcher in front of them. Served rows equal the engine's;
jobs reach both children; a child killed with SIGKILL under load fails no request and is
restarted; stopping the front-end leaves no child behind.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from support.e2e import ATOL, MODEL, RTOL, expected, pick

from hopserve.worker.runtime.allocator import active_allocator, find_tcmalloc

WORKERS = ("worker-0", "worker-1")


def wait_for(condition, timeout: float = 120.0, what: str = "condition") -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def pooled(make_config, launch):
    server = launch(make_config(local_workers=2, max_batch_targets=16), expect_ready=None)
    ready = server.call(lambda: server.service.wait_ready(180), timeout=200)
    assert ready, [(m.name, m.state, m.error) for m in server.service.models]
    # Ready means one process serves; the other may still be loading its models (a
    # worker binds its socket once they are loaded). Then the dispatcher's probe finds it.
    sockets = [Path(a.removeprefix("unix:")) for a in server.service._workers.pool.addresses]
    wait_for(lambda: all(p.exists() for p in sockets), what="both sockets")
    wait_for(lambda: all(up(server, w) for w in WORKERS), what="both processes up")
    yield server
    server.stop()


def up(server, worker: str) -> bool:
    return server.sample("hopserve_worker_up", worker=worker) == 1


def jobs(server, worker: str) -> float:
    return server.sample("hopserve_worker_jobs_total", worker=worker, outcome="ok")


def test_rows_are_exact_and_both_processes_compute(pooled, evaluator, all_ids) -> None:
    pool = pooled.service._workers.pool
    socket_dir = Path(pool.addresses[0].removeprefix("unix:")).parent
    assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700  # only this user connects
    # Rounds of concurrent requests until both processes have computed (a channel that
    # tried a socket before its worker bound it waits out gRPC's reconnect backoff).
    deadline, seed = time.monotonic() + 60, 200
    with pooled.client() as client, ThreadPoolExecutor(8) as threads:
        while True:
            sets = [pick(all_ids, seed + i, 12) for i in range(16)]
            seed += 16
            answers = threads.map(
                lambda s: client.get_embeddings(MODEL, s, cache_policy="bypass"), sets
            )
            for ids, got in zip(sets, answers, strict=True):
                np.testing.assert_allclose(got, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
            counts = [jobs(pooled, w) for w in WORKERS]
            if all(counts) or time.monotonic() > deadline:
                break
    assert all(counts), counts
    assert all(pool.pid(w) != os.getpid() for w in WORKERS)


@pytest.mark.skipif(find_tcmalloc() is None, reason="libtcmalloc-minimal4 is not installed")
def test_the_processes_allocate_with_tcmalloc_where_installed(pooled) -> None:
    """glibc malloc keeps a worker's freed batch memory fragmented; the front-end starts
    its workers with tcmalloc preloaded (``worker/runtime/allocator.py``)."""
    pool = pooled.service._workers.pool
    for w in WORKERS:
        maps = Path(f"/proc/{pool.pid(w)}/maps")
        assert active_allocator(maps) == "tcmalloc", w


def test_a_killed_process_fails_no_request_and_is_restarted(pooled, evaluator, all_ids) -> None:
    pool = pooled.service._workers.pool
    victim = pool.pid("worker-1")
    assert victim is not None
    restarts = pool.restarts["worker-1"]
    sets = [pick(all_ids, 500 + i, 10) for i in range(60)]

    def ask(ids: np.ndarray) -> np.ndarray:
        with pooled.client() as client:
            return client.get_embeddings(MODEL, ids, cache_policy="bypass")

    with ThreadPoolExecutor(6) as threads:
        futures = [threads.submit(ask, s) for s in sets[:20]]
        os.kill(victim, signal.SIGKILL)
        futures += [threads.submit(ask, s) for s in sets[20:]]
        answers = [f.result(timeout=120) for f in futures]  # none may fail
    for ids, got in zip(sets, answers, strict=True):
        np.testing.assert_allclose(got, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
    wait_for(lambda: pool.restarts["worker-1"] > restarts, what="the restart")
    wait_for(lambda: up(pooled, "worker-1"), what="worker-1 up again")
    assert pool.pid("worker-1") not in (None, victim)


def test_stopping_the_front_end_stops_every_process(make_config, launch) -> None:
    server = launch(make_config(local_workers=2), expect_ready=None)
    pool = server.service._workers.pool
    wait_for(lambda: all(pool.pid(w) for w in WORKERS), what="both processes")
    pids = [pool.pid(w) for w in WORKERS]
    socket_dir = Path(pool.addresses[0].removeprefix("unix:")).parent
    server.stop()
    wait_for(lambda: not any(alive(p) for p in pids), timeout=30, what="the children to exit")
    assert not socket_dir.exists()


def test_a_model_the_processes_cannot_load_fails_instead_of_crash_looping(
    make_config, start_server
) -> None:
    server = start_server(make_config(local_workers=1, model={"kwargs": {}}), expect_ready=None)
    ready = server.call(lambda: server.service.wait_ready(180), timeout=200)
    model = server.service.models.get(MODEL)
    assert not ready and model.state == "failed"
    assert "worker process" in model.error and "constructor rejected kwargs" in model.error
    assert server.service._workers.pool.restarts["worker-0"] == 0
