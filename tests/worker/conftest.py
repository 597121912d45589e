"""Fixtures of the worker service tests: the tiny servable model on a served CPU worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.servable import Servable, write_servable

from hopserve.worker.runtime import make_worker
from hopserve.worker.runtime.base import Worker
from hopserve.worker.service import serve_worker


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Servable, Worker, str]]:
    """``(servable, worker, address)``: a CPU worker (id ``svc-worker``) with the tiny
    servable model, served by ``serve_worker`` on loopback; stopped after the module."""
    servable = write_servable(tmp_path_factory.mktemp("svc"))
    worker = make_worker("cpu", worker_id="svc-worker")
    worker.load_model(servable.config())
    server, port = serve_worker(worker, "127.0.0.1", 0)
    yield servable, worker, f"127.0.0.1:{port}"
    server.stop(None).wait(5)
    worker.close()
