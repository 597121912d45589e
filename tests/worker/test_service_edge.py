"""Hostile jobs at the worker's edge: every one is INVALID_ARGUMENT naming what is wrong.

Real components (``served``, conftest.py): the tiny servable model on a CPU worker, served
by ``serve_worker`` on loopback; raw bytes go through a generic ``unary_unary`` (no
client-side encoding).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import assert_exact
from support.logs import Records, capture_records
from support.servable import exact_job

from hopserve.proto.codec import job_from_proto, job_to_proto
from hopserve.proto.contract import InvalidJobError, Job, JobError
from hopserve.proto.v1 import worker_pb2
from hopserve.worker.service import SERVICE_NAME

RUN_JOB = f"/{SERVICE_NAME}/RunJob"
MAX_DETAILS = 1024  # bytes (hopserve.rpc.MAX_STATUS_BYTES)


@pytest.fixture
def records() -> Iterator[Records]:
    with capture_records() as handler:
        yield handler


def _run_raw(address: str, data: bytes, method: str = RUN_JOB) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            call(data, timeout=20)
    return info.value


def _job(job: Job, **fields: object) -> bytes:
    msg = job_to_proto(job)
    for name, value in fields.items():
        if value is None:
            msg.ClearField(name)
        elif name == "fanouts":  # what a hostile client sends, past the encoder's checks
            msg.ClearField("fanouts")
            msg.fanouts.extend(value)
        else:
            setattr(msg, name, value)
    return msg.SerializeToString()


# ----------------------------------------------------------------------------- decoding


def test_undecodable_bytes_are_invalid_argument(served, records) -> None:
    servable, _, address = served
    for data in (b"\x0a\x05\xff\xfe\xfd\xfc\xfb", b"\x2a\x40abc", b"\xff" * 7):
        err = _run_raw(address, data)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "not a valid hopserve.v1.JobRequest" in err.details()
    err = _run_raw(address, b"\xff" * 7, f"/{SERVICE_NAME}/WorkerStatus")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not [r for r in records.records if r.exc_info or r.levelno >= logging.ERROR]
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        call = channel.unary_unary(RUN_JOB, request_serializer=None, response_deserializer=None)
        good = worker_pb2.JobResult.FromString(call(_job(exact_job(servable.store, [3]))))
    assert good.num_rows == 1


def test_client_values_in_worker_errors_are_bounded(served) -> None:
    _, _, address = served
    huge = "j" * 100_000
    cases = [
        (Job("x", huge, "1", np.array([1])), grpc.StatusCode.NOT_FOUND),
        (Job(huge, "nope", huge, np.array([1])), grpc.StatusCode.NOT_FOUND),
        (Job(huge, "tiny", "1", np.array([10_000])), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for job, code in cases:
        err = _run_raw(address, _job(job))
        assert err.code() == code, err
        assert len(err.details().encode()) <= MAX_DETAILS, len(err.details().encode())
        assert "j" * 65 not in err.details()


# ----------------------------------------------------------------------------- fanouts, seed


@pytest.mark.parametrize(
    ("fanouts", "seed", "match"),
    [
        ((0, 2), 1, r"fanouts\[0\] \(layer 1\) is 0"),
        ((2, 0), 1, r"fanouts\[1\] \(layer 2\) is 0"),
        ((3, -7), 1, r"fanouts\[1\] \(layer 2\) is -7"),
        ((2, 2), None, "seed is required"),
        ((-1, 5), None, "seed is required"),
    ],
)
def test_bad_fanouts_and_missing_seed_are_invalid(served, fanouts, seed, match) -> None:
    _, _, address = served
    data = _job(Job("f", "tiny", "1", np.array([1, 2]), seed=1), fanouts=fanouts, seed=seed)
    err = _run_raw(address, data)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert re.search(match, err.details()), err.details()


def test_fanout_zero_is_refused_in_process_too(served) -> None:
    _, worker, _ = served
    with pytest.raises(InvalidJobError, match=r"fanouts\[1\] \(layer 2\) is 0"):
        worker.execute(Job("z", "tiny", "1", np.array([1]), fanouts=(2, 0), seed=3))


def test_all_neighbour_fanouts_need_no_seed(served) -> None:
    servable, _, address = served
    msg = worker_pb2.JobRequest.FromString(
        _job(Job("a", "tiny", "1", np.array([4, 9]), fanouts=(-1, -1)), seed=None)
    )
    assert not msg.HasField("seed")
    job = job_from_proto(msg)
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(RUN_JOB, request_serializer=None, response_deserializer=None)
        reply = worker_pb2.JobResult.FromString(call(msg.SerializeToString(), timeout=20))
    rows = np.frombuffer(reply.embeddings, "<f4").reshape(2, 4)
    assert_exact(torch.from_numpy(rows.copy()), servable.reference[[4, 9]], "fanouts -1")
    assert job.fanouts is None  # all neighbours at every layer is exact evaluation


# ----------------------------------------------------------------------------- frontiers


def _neighbours(store, nodes: np.ndarray) -> np.ndarray:
    indptr, indices = store.indptr.numpy(), store.indices.numpy()
    parts = [indices[indptr[v] : indptr[v + 1]] for v in nodes]
    return np.unique(np.concatenate([nodes, *parts]).astype(np.int64))


def test_frontiers_missing_in_neighbours_are_invalid(served) -> None:
    servable, worker, address = served
    store = servable.store
    top = np.array([0], dtype=np.int64)  # node 0's in-neighbours are not all below it
    bad = [
        (top, top, top),  # V^1 lacks V^2's in-neighbours
        (None, top, top),
        (None, _neighbours(store, top)[:-1], top),  # V^1 lacks the largest in-neighbour
        (None, np.delete(_neighbours(store, top), 1), top),  # ... or the smallest (0 is V^2)
    ]
    for frontiers in bad:
        job = Job("nb", "tiny", "1", top, frontiers=frontiers)
        with pytest.raises(InvalidJobError, match=r"in-neighbours? of V\^2"):
            worker.execute(job)
        err = _run_raw(address, job_to_proto(job).SerializeToString())
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (frontiers, err)
        assert "V^2" in err.details() and "V^1" in err.details()
    with pytest.raises(InvalidJobError, match=r"expected 3: V\^0 … V\^2"):
        worker.execute(Job("nb", "tiny", "1", top, frontiers=(top, top)))  # one per layer
    good = exact_job(store, top)  # what the planner sends still works
    assert_exact(torch.from_numpy(worker.execute(good).embeddings), servable.reference[[0]])


nodes = st.lists(st.integers(0, 119), min_size=1, max_size=40, unique=True).map(
    lambda v: np.array(sorted(v), dtype=np.int64)
)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    targets=nodes,
    extra=st.lists(nodes, min_size=3, max_size=3),
    full=st.lists(st.booleans(), min_size=3, max_size=3),
    form=st.sampled_from(["L+1", "L"]),
)
def test_random_frontiers_never_crash_the_worker(served, targets, extra, full, form) -> None:
    """Any nested frontiers: the job is computed or refused as invalid, never INTERNAL."""
    _, worker, _ = served
    layers: list[np.ndarray | None] = []
    current = targets
    for level in range(2, -1, -1):  # V^2, V^1, V^0: each a superset of the one above
        current = np.union1d(current, extra[level])
        layers.append(None if full[level] and level < 2 else current)
    layers.reverse()
    for level in range(1, 3):  # "all nodes" below a real frontier only
        if layers[level] is None:
            layers[level - 1] = None
    frontiers = tuple(layers if form == "L+1" else layers[1:])
    try:
        result = worker.execute(Job("r", "tiny", "1", targets, frontiers=frontiers))
    except InvalidJobError as err:
        assert "V^" in str(err)
    except JobError as err:  # pragma: no cover - the failure this test is about
        pytest.fail(f"{type(err).__name__}: {err}")
    else:
        assert result.embeddings.shape == (len(targets), 4)
