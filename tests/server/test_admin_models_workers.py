"""Hot swaps when the models live in worker processes (``server.local_workers``).

Real processes: two ``hopserve worker`` children on Unix sockets behind the front-end's
dispatcher. A version loaded through AdminService is loaded by both children
(``WorkerService.LoadModel``) and self-checked through them; an unloaded one leaves both;
a child restarted afterwards loads what is served now, not the start-up config.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.model_versions import MODEL, ServiceThread, Versions, write_versions

from hopserve.client import InvalidArgumentError

WORKERS = ("worker-0", "worker-1")


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    return write_versions(tmp_path_factory.mktemp("versions"))


@pytest.fixture
def pooled(versions: Versions) -> Iterator[ServiceThread]:
    server = ServiceThread(versions.config(["1"], local_workers=2))
    sockets = [Path(a.removeprefix("unix:")) for a in server.service._workers.pool.addresses]
    _until(lambda: all(p.exists() for p in sockets), "both sockets")
    _until(lambda: all(_loaded(server, w) == {(MODEL, "1")} for w in WORKERS), "both up")
    yield server
    server.stop()


def _clients(server: ServiceThread) -> dict[str, object]:
    return {c.name: c for c in server.service._workers.dispatchers[0].clients}


def _loaded(server: ServiceThread, worker: str) -> set[tuple[str, str]] | None:
    client = _clients(server)[worker]
    try:
        status = server.call(client.status)  # type: ignore[attr-defined]
    except Exception:
        return None
    return {(m.name, m.version) for m in status.models}


def test_swap_on_worker_processes(pooled: ServiceThread, versions: Versions) -> None:
    ids = versions.external_ids[:40]
    with pooled.admin() as admin, pooled.client() as client:
        info = admin.load_model(versions.entry("2"), make_default=True)
        assert info.is_default and info.ready
        assert all(_loaded(pooled, w) == {(MODEL, "1"), (MODEL, "2")} for w in WORKERS)
        res = client.get_embeddings_with_info(MODEL, ids)
        assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)
        assert admin.unload_model(MODEL, "1").version == "1"
        assert all(_loaded(pooled, w) == {(MODEL, "2")} for w in WORKERS)
        # a bad entry is refused by the workers and leaves nothing behind
        bad = versions.entry("2", version="3", kwargs={**versions.kwargs, "hidden": 3})
        with pytest.raises(InvalidArgumentError, match="cannot load the model"):
            admin.load_model(bad)
        assert all(_loaded(pooled, w) == {(MODEL, "2")} for w in WORKERS)
        # a child restarted now loads the served version, not the start-up config
        pid = pooled.service._workers.pool.pid("worker-0")
        os.kill(pid, signal.SIGKILL)
        _until(lambda: pooled.service._workers.pool.pid("worker-0") not in (None, pid), "restart")
        _until(lambda: _loaded(pooled, "worker-0") == {(MODEL, "2")}, "restarted worker")
        res = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
        assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)


def _until(condition: object, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_restarted_remote_worker_gets_the_served_versions(
    versions: Versions, tmp_path: Path
) -> None:
    """A remote worker restarts with its own config (version 1 only); the front-end loads
    version 2, served since, on it again."""
    import subprocess
    import sys

    import yaml
    from support.processes import child_env

    from hopserve.testing import free_port, wait_for_port

    port = free_port()
    (tmp_path / "worker.yaml").write_text(yaml.safe_dump({"models": [versions.entry("1")]}))
    argv = [sys.executable, "-m", "hopserve", "worker", "-c", str(tmp_path / "worker.yaml"),
            "--port", str(port)]  # fmt: skip

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=child_env(), stderr=subprocess.DEVNULL)
        wait_for_port(port, 120, proc)
        return proc

    worker = start()
    server = ServiceThread(versions.config(["1"], workers=[f"127.0.0.1:{port}"]))
    try:
        with server.admin() as admin:
            admin.load_model(versions.entry("2"), make_default=True)
            admin.unload_model(MODEL, "1")
        name = next(iter(_clients(server)))
        assert _loaded(server, name) == {(MODEL, "2")}
        worker.kill()
        worker.wait(30)
        worker = start()
        _until(lambda: _loaded(server, name) == {(MODEL, "1"), (MODEL, "2")}, "version 2 again")
        ids = versions.external_ids[:20]
        with server.client() as client:
            res = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
        assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)
    finally:
        server.stop()
        worker.kill()
        worker.wait(30)
