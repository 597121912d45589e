"""Fixtures for the worker runtime tests: the tiny servable model on a CPU worker."""

from __future__ import annotations

import pytest
from support.servable import Servable, write_servable

from hopserve.config import EngineConfig
from hopserve.worker.runtime import make_worker


@pytest.fixture(scope="module")
def servable(tmp_path_factory: pytest.TempPathFactory) -> Servable:
    return write_servable(tmp_path_factory.mktemp("servable"))


@pytest.fixture(scope="module")
def worker(servable: Servable):
    w = make_worker("cpu", worker_id="test-worker")
    w.load_model(servable.config(), EngineConfig(memory_budget_bytes="16MiB"))
    yield w
    w.close()
