"""Dispatcher over real workers: least-loaded choice, failover, fast failure, recovery."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from support import assert_exact
from support.servable import write_servable

from hopserve.proto.contract import (
    DeadlineExceededError,
    Job,
    ModelNotFoundError,
    WorkerUnavailableError,
)
from hopserve.server.dispatch import Dispatcher
from hopserve.server.worker_clients import InProcessWorkerClient, RemoteWorkerClient
from hopserve.worker.runtime import make_worker
from hopserve.worker.service import serve_worker

TARGETS = [3, 40, 41]


@pytest.fixture(scope="module")
def servable(tmp_path_factory):
    return write_servable(tmp_path_factory.mktemp("dispatch"))


@pytest.fixture(scope="module")
def workers(servable):
    ws = []
    for i in range(2):
        w = make_worker("cpu", worker_id=f"w{i}")
        w.load_model(servable.config())
        ws.append(w)
    yield ws
    for w in ws:
        w.close()


def job(job_id: str = "j", **kw) -> Job:
    return Job(job_id, "tiny", "1", np.array(TARGETS), **kw)


def check(result, servable) -> None:
    assert_exact(torch.from_numpy(np.array(result.embeddings)), servable.reference[TARGETS])


class Servers:
    """Loopback worker servers that a test may stop and restart on the same port."""

    def __init__(self, workers) -> None:
        self.workers = workers
        self.servers = {}
        self.ports = {}
        for i in range(len(workers)):
            self.start(i)

    def start(self, i: int) -> None:
        server, port = serve_worker(self.workers[i], "127.0.0.1", self.ports.get(i, 0))
        self.servers[i], self.ports[i] = server, port

    def stop(self, i: int) -> None:
        self.servers.pop(i).stop(None).wait(5)

    def address(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    def close(self) -> None:
        for i in list(self.servers):
            self.stop(i)


@pytest.fixture
def servers(workers):
    s = Servers(workers)
    yield s
    s.close()


def remote_dispatcher(servers, events, **kw) -> Dispatcher:
    clients = [RemoteWorkerClient(servers.address(i), name=f"r{i}", timeout_s=10) for i in (0, 1)]
    return Dispatcher(clients, on_worker_state=lambda n, up: events.append((n, up)), **kw)


def test_least_loaded_worker_gets_the_job(workers, servable):
    async def scenario():
        a = InProcessWorkerClient(workers[0], name="a")
        b = InProcessWorkerClient(workers[1], name="b")
        dispatcher = Dispatcher([a, b])
        entry = workers[0].model("tiny", "1")
        entry.lock.acquire()  # a's job stays in flight
        try:
            pending = asyncio.ensure_future(a.run(job("busy")))
            await asyncio.sleep(0.05)
            assert a.inflight == 1 and b.inflight == 0
            chosen = [(await dispatcher.run(job(f"j{i}"))).worker for i in range(3)]
            assert chosen == ["b", "b", "b"]
        finally:
            entry.lock.release()
        check(await pending, servable)
        # equally loaded: round robin
        chosen = {(await dispatcher.run(job(f"k{i}"))).worker for i in range(4)}
        assert chosen == {"a", "b"}
        await dispatcher.close()

    asyncio.run(scenario())


def test_job_errors_are_not_failed_over(workers):
    async def scenario():
        events = []
        clients = [InProcessWorkerClient(w, name=w.worker_id) for w in workers]
        dispatcher = Dispatcher(clients, on_worker_state=lambda n, up: events.append((n, up)))
        with pytest.raises(ModelNotFoundError):
            await dispatcher.run(Job("u", "nope", "1", np.array([1])))
        with pytest.raises(DeadlineExceededError):
            await dispatcher.run(job(deadline=time.time() - 1))
        assert dispatcher.states() == {"w0": True, "w1": True}
        assert events == [("w0", True), ("w1", True)]  # initial state only
        await dispatcher.close()

    asyncio.run(scenario())


def test_failover_when_a_remote_worker_stops(servers, servable):
    events = []

    async def scenario():
        dispatcher = remote_dispatcher(servers, events, retry_after_s=60)
        check(await dispatcher.run(job("warm")), servable)
        servers.stop(0)
        results = [await dispatcher.run(job(f"f{i}")) for i in range(3)]
        await dispatcher.close()
        return results, dispatcher.states()

    results, states = asyncio.run(scenario())
    for r in results:
        check(r, servable)
        assert r.worker == "r1"
    assert states == {"r0": False, "r1": True}
    assert ("r0", False) in events


def test_all_down_fails_fast_then_recovers_after_backoff(servers, servable):
    events = []

    async def scenario():
        dispatcher = remote_dispatcher(servers, events, retry_after_s=0.3)
        servers.stop(0)
        servers.stop(1)
        for attempt in range(2):  # first: both tried; second: both still in backoff
            t0 = time.monotonic()
            with pytest.raises(WorkerUnavailableError, match="no worker available") as info:
                await dispatcher.run(job(f"down{attempt}", deadline=time.time() + 30))
            assert time.monotonic() - t0 < 2.0
            assert "r0" in str(info.value) and "r1" in str(info.value)
        assert dispatcher.states() == {"r0": False, "r1": False}
        servers.start(1)  # r1 comes back on its old port
        t0 = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            try:
                result = await dispatcher.run(job("back"))
                break
            except WorkerUnavailableError:
                assert time.monotonic() - t0 < 5, "worker not used again after its backoff"
        await dispatcher.close()
        return result, dispatcher.states()

    result, states = asyncio.run(scenario())
    check(result, servable)
    assert result.worker == "r1" and states == {"r0": False, "r1": True}
    assert events[-1] == ("r1", True)


def test_background_probe_brings_a_worker_back(servers):
    events = []

    async def scenario():
        dispatcher = remote_dispatcher(servers, events, retry_after_s=0.2, probe_interval_s=0.1)
        dispatcher.start()
        servers.stop(0)
        while dispatcher.states()["r0"]:  # traffic finds it down
            await dispatcher.run(job())
        servers.start(0)
        t0 = time.monotonic()
        while not dispatcher.states()["r0"]:  # no traffic: the probe finds it up
            assert time.monotonic() - t0 < 5, "probe did not bring r0 back"
            await asyncio.sleep(0.05)
        await dispatcher.close()

    asyncio.run(scenario())
    assert events[-2:] == [("r0", False), ("r0", True)]


def test_remote_client_never_hangs_on_a_dead_address():
    async def scenario():
        client = RemoteWorkerClient("127.0.0.1:1", timeout_s=30)
        t0 = time.monotonic()
        with pytest.raises(WorkerUnavailableError, match="127.0.0.1:1"):
            await client.run(job())
        with pytest.raises(WorkerUnavailableError):
            await client.status()
        await client.close()
        return time.monotonic() - t0

    assert asyncio.run(scenario()) < 2.0
