"""A worker loads and unloads model versions while it runs jobs of another one.

torch.fx patches ``Module.__call__`` for the whole process while it traces; without
:data:`~hopserve.worker.runtime.fx_guard.FX_GUARD` a job running meanwhile failed with
``NameError: module is not installed as a submodule`` (seen in a model swap under load).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from support.model_versions import MODEL, write_versions
from support.servable import exact_job

from hopserve import GraphStore
from hopserve.config import ModelConfig
from hopserve.worker.runtime import make_worker
from hopserve.worker.runtime.fx_guard import FxGuard


def test_jobs_run_while_versions_load_and_unload(tmp_path: Path) -> None:
    versions = write_versions(tmp_path, {"1": 1, "2": 2}, num_nodes=300, num_edges=2000)
    worker = make_worker("cpu")
    worker.load_model(ModelConfig(**versions.entry("1")))
    store = GraphStore.open(versions.graph_dir)
    stop, errors, done = threading.Event(), [], [0]

    def serve() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            ids = np.unique(rng.integers(0, store.num_nodes, 150))
            try:
                result = worker.execute(exact_job(store, ids, model=MODEL, version="1"))
            except Exception as err:
                errors.append(repr(err))
                return
            assert result.model_version == "1"
            done[0] += 1

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        for k in range(20):
            worker.load_model(ModelConfig(**versions.entry("2", version=f"x{k}")))
            assert worker.unload_model(MODEL, f"x{k}")
    finally:
        stop.set()
        thread.join(60)
        worker.close()
    assert errors == [] and done[0] > 0
    assert not worker.unload_model(MODEL, "x0")  # idempotent


def test_guard_excludes_runs_from_traces() -> None:
    guard, events = FxGuard(), []
    with guard.running():
        tracer = threading.Thread(target=lambda: _trace(guard, events))
        tracer.start()
        time.sleep(0.05)
        events.append("run ends")  # the trace waited for it
    tracer.join(5)
    assert events == ["run ends", "trace"]


def _trace(guard: FxGuard, events: list[str]) -> None:
    with guard.tracing():
        events.append("trace")
