"""WorkerService over a real loopback server (the codec is tested in tests/proto)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import empty_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import assert_exact
from support.servable import exact_job, write_servable

from hopserve.proto.codec import job_to_proto
from hopserve.proto.contract import (
    DeadlineExceededError,
    GraphVersionMismatchError,
    InvalidJobError,
    Job,
    ModelNotFoundError,
    WorkerBusyError,
)
from hopserve.proto.v1 import worker_pb2, worker_pb2_grpc
from hopserve.server.worker_clients import RemoteWorkerClient
from hopserve.worker.service import SERVICE_NAME, serve_worker

# ---------------------------------------------------------------------------- service
# ``served`` (conftest.py): the tiny servable model on a CPU worker "svc-worker", served.


async def _remote(address: str, *jobs: Job):
    client = RemoteWorkerClient(address, name="remote")
    try:
        return [await client.run(job) for job in jobs]
    finally:
        await client.close()


def test_remote_job_equals_in_process(served):
    servable, worker, address = served
    exact = exact_job(servable.store, [1, 30, 31, 99], deadline=time.time() + 30)
    sampled = Job("s", "tiny", "1", np.array([5, 6]), fanouts=(2, 3), seed=9)
    remote = asyncio.run(_remote(address, exact, sampled))
    for job, got in zip((exact, sampled), remote, strict=True):
        local = worker.execute(job)
        np.testing.assert_array_equal(got.embeddings, local.embeddings)
        assert got.job_id == job.job_id and got.worker == "remote"
        assert got.stats.frontier_sizes == local.stats.frontier_sizes
        assert got.stats.batches == local.stats.batches
    assert_exact(torch.from_numpy(remote[0].embeddings.copy()), servable.reference[[1, 30, 31, 99]])


@pytest.mark.parametrize(
    ("job", "error", "match"),
    [
        (Job("u", "nope", "1", np.array([1])), ModelNotFoundError, "'nope'"),
        (Job("i", "tiny", "1", np.array([10_000])), InvalidJobError, "outside"),
        (
            Job("d", "tiny", "1", np.array([1]), deadline=time.time() - 5),
            DeadlineExceededError,
            "deadline passed",
        ),
    ],
)
def test_remote_errors_keep_their_type(served, job, error, match):
    _, _, address = served
    with pytest.raises(error, match=match):
        asyncio.run(_remote(address, job))


def test_graph_version_mismatch_and_malformed_bytes(served):
    servable, _, address = served

    async def with_versions(version: str):
        client = RemoteWorkerClient(address)
        try:
            return await client.run(Job("g", "tiny", "1", np.array([1]), graph_version=version))
        finally:
            await client.close()

    assert asyncio.run(with_versions(servable.store.version)).embeddings.shape == (1, 4)
    with pytest.raises(GraphVersionMismatchError, match="'stale'"):
        asyncio.run(with_versions("stale"))
    with grpc.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        msg = job_to_proto(Job("g", "tiny", "1", np.array([1]), graph_version="other"))
        with pytest.raises(grpc.RpcError) as info:
            stub.RunJob(msg, timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "other" in info.value.details()
        bad = worker_pb2.JobRequest(job_id="b", model="tiny", model_version="1", targets=b"123")
        with pytest.raises(grpc.RpcError) as info:
            stub.RunJob(bad, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_worker_status_and_health(served):
    servable, _, address = served

    async def status():
        client = RemoteWorkerClient(address)
        try:
            return await client.status()
        finally:
            await client.close()

    info = asyncio.run(status())
    assert info.worker_id == "svc-worker" and info.device == "cpu"
    (model,) = info.models
    assert (model.name, model.version, model.dim, model.num_layers) == ("tiny", "1", 4, 2)
    assert (model.graph_version, model.graph_num_nodes) == (
        servable.store.version,
        servable.store.num_nodes,
    )
    assert (model.mode, model.reads_input_frontier) == ("layerwise", False)
    assert [b.kind for b in model.blocks] == ["SAGEConv", "SAGEConv"]
    assert info.memory.total > info.memory.used > 0
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        raw = worker_pb2_grpc.WorkerServiceStub(channel).WorkerStatus(empty_pb2.Empty(), timeout=5)
        assert raw.worker_id == "svc-worker"


def test_busy_worker_answers_resource_exhausted(served):
    servable, worker, _ = served
    server, port = serve_worker(worker, "127.0.0.1", 0, max_pending_jobs=1)
    entry = worker.model("tiny", "1")
    entry.lock.acquire()  # the first job waits for the model ...

    async def two_jobs():
        client = RemoteWorkerClient(f"127.0.0.1:{port}")
        try:
            first = asyncio.ensure_future(client.run(Job("a", "tiny", "1", np.array([1]))))
            await asyncio.sleep(0.3)
            with pytest.raises(WorkerBusyError):  # ... so the second is refused
                await client.run(Job("b", "tiny", "1", np.array([2])))
            entry.lock.release()
            return await first
        finally:
            await client.close()

    try:
        result = asyncio.run(two_jobs())
        assert_exact(torch.from_numpy(result.embeddings.copy()), servable.reference[[1]])
    finally:
        if entry.lock.locked():
            entry.lock.release()
        server.stop(None).wait(5)


# ---------------------------------------------------------------------------- CLI


def test_hopserve_worker_command_serves_until_sigterm(tmp_path):
    servable = write_servable(tmp_path)
    config = tmp_path / "hopserve.yaml"
    config.write_text(
        "models:\n"
        "  - name: tiny\n"
        "    entrypoint: support.servable:TinySAGE\n"
        f"    kwargs: {{in_dim: 6, hidden: 8, out_dim: 4}}\n"
        f"    weights: {servable.weights}\n"
        f"    graph: {servable.graph_dir}\n"
        "engine:\n"
        "  memory_budget_bytes: 64MiB\n"
    )
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": tests_dir, "HOPSERVE_SERVER__GRACE_PERIOD_S": "1"}
    cmd = [sys.executable, "-m", "hopserve", "worker", "-c", str(config), "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--threads", "1"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        port = None
        lines = []
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
        assert port is not None, "".join(lines)
        (result,) = asyncio.run(_remote(f"127.0.0.1:{port}", Job("c", "tiny", "1", np.array([4]))))
        assert_exact(torch.from_numpy(result.embeddings.copy()), servable.reference[[4]])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hopserve_worker_command_reports_bad_models(tmp_path):
    config = tmp_path / "hopserve.yaml"
    (tmp_path / "g").mkdir()
    config.write_text(
        f"models:\n  - name: m\n    entrypoint: nowhere.mod:M\n    graph: {tmp_path / 'g'}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "hopserve", "worker", "-c", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model 'm'")
