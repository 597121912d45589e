"""hopserve.proto.codec: contract dataclasses <-> worker protos, and job errors <-> codes."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.proto import contract
from hopserve.proto.codec import (
    error_for_status,
    job_from_proto,
    job_to_proto,
    result_from_proto,
    result_to_proto,
    status_for_error,
    status_from_proto,
    status_to_proto,
)
from hopserve.proto.contract import (
    BlockInfo,
    DeviceMemory,
    Job,
    JobResult,
    LayerStats,
    ModelStatus,
    RunStats,
    WorkerStatus,
    validate_fanouts,
)
from hopserve.proto.v1 import embedding_pb2, worker_pb2

ids = st.lists(st.integers(0, 2**40), min_size=1, max_size=30, unique=True).map(
    lambda v: np.array(sorted(v), dtype=np.int64)
)
frontier_entry = st.one_of(st.none(), ids)
fanout = st.one_of(st.just(-1), st.integers(1, 50))
jobs = st.builds(
    Job,
    job_id=st.text(max_size=10),
    model=st.sampled_from(["sage", "gat"]),
    model_version=st.sampled_from(["1", "v2"]),
    targets=ids,
    frontiers=st.one_of(st.none(), st.lists(frontier_entry, min_size=1, max_size=5).map(tuple)),
    fanouts=st.one_of(st.none(), st.lists(fanout, min_size=1, max_size=4).map(tuple)),
    seed=st.integers(0, 2**64 - 1),
    deadline=st.one_of(st.none(), st.floats(1.0, 4e9)),
    graph_version=st.sampled_from(["", "g1"]),
)


def _same_array(a, b) -> bool:
    return (a is None and b is None) or (
        a is not None and b is not None and a.dtype == np.int64 and np.array_equal(a, b)
    )


@settings(max_examples=150, deadline=None)
@given(jobs)
def test_job_round_trip(job):
    wire = worker_pb2.JobRequest.FromString(job_to_proto(job).SerializeToString())
    back = job_from_proto(wire)
    assert (back.job_id, back.model, back.model_version, back.graph_version) == (
        job.job_id,
        job.model,
        job.model_version,
        job.graph_version,
    )
    assert _same_array(back.targets, job.targets)
    if job.frontiers is None:
        assert back.frontiers is None
    else:
        assert len(back.frontiers) == len(job.frontiers)
        assert all(_same_array(a, b) for a, b in zip(back.frontiers, job.frontiers, strict=True))
    # all -1 samples nothing: the contract spells exact as None
    assert back.fanouts == validate_fanouts(job.fanouts)
    assert (back.seed, back.deadline) == (job.seed, job.deadline)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(0, 20),
    dim=st.integers(1, 9),
    sizes=st.lists(st.integers(0, 10**9), max_size=5),
    times=st.lists(st.floats(0, 100), min_size=6, max_size=6),
)
def test_result_round_trip(rows, dim, sizes, times):
    emb = np.random.default_rng(rows * 31 + dim).standard_normal((rows, dim)).astype(np.float32)
    layers = [
        LayerStats(i, rows=s, batches=7, oom_halvings=i, compute_s=0.5, peak_bytes=s)
        for i, s in enumerate(sizes)
    ]
    stats = RunStats(*times, frontier_sizes=sizes, layers=layers, tiers={"h": "host"}, device="cpu")
    msg = result_to_proto(JobResult("r1", emb, stats, graph_version="g"))
    back = result_from_proto(worker_pb2.JobResult.FromString(msg.SerializeToString()), worker="w")
    np.testing.assert_array_equal(back.embeddings, emb)
    assert back.embeddings.shape == (rows, dim) and back.worker == "w"
    assert back.stats == stats  # one stats type, field by field, engine to wire and back
    assert (back.stats.peak_bytes, back.stats.oom_halvings) == (
        stats.peak_bytes,
        stats.oom_halvings,
    )
    assert (msg.graph_version, msg.stats.device) == ("g", "cpu")


def test_none_frontier_is_an_empty_entry():
    job = Job("n", "m", "1", np.array([2]), frontiers=(None, np.array([1, 2]), np.array([2])))
    msg = job_to_proto(job)
    assert list(msg.frontiers)[0] == b"" and len(msg.frontiers) == 3
    assert len(job_to_proto(Job("n", "m", "1", np.array([2]))).frontiers) == 0


@pytest.mark.parametrize(
    ("job", "match"),
    [
        (Job("e", "m", "1", np.array([1]), frontiers=(np.array([], np.int64),)), "empty"),
        (Job("e", "m", "1", np.array([1]), frontiers=()), "empty tuple"),
        (Job("e", "m", "1", np.array([1]), fanouts=(0,)), r"fanouts\[0\] \(layer 1\) is 0"),
        (Job("e", "m", "1", np.array([1]), fanouts=(2**31,)), r"fanouts\[0\]"),
        (Job("e", "m", "1", np.array([1]), seed=-1), "seed"),
        (Job("e", "m", "1", np.array([1]), deadline=float("nan")), "deadline"),
        (Job("e", "m", "1", np.array([], np.int64)), "targets is empty"),
        (Job("e", "m", "1", np.array([1.5])), "integers"),
    ],
)
def test_unencodable_jobs(job, match):
    with pytest.raises(ValueError, match=match):
        job_to_proto(job)


def test_malformed_messages_are_refused():
    with pytest.raises(contract.InvalidJobError, match="multiple of 8"):
        job_from_proto(worker_pb2.JobRequest(job_id="x", targets=b"\x00" * 7))
    with pytest.raises(contract.InvalidJobError, match="empty"):
        job_from_proto(worker_pb2.JobRequest(job_id="x"))
    good = result_to_proto(JobResult("r", np.zeros((2, 3), np.float32), RunStats()))
    short = worker_pb2.JobResult()
    short.CopyFrom(good)
    short.embeddings = good.embeddings[:-4]
    with pytest.raises(ValueError, match="expected 24"):
        result_from_proto(short)
    short.CopyFrom(good)
    short.dtype = embedding_pb2.DTYPE_UNSPECIFIED
    with pytest.raises(ValueError, match="DTYPE_UNSPECIFIED"):
        result_from_proto(short)


def test_status_codes_map_both_ways():
    for err in (
        contract.ModelNotFoundError("m"),
        contract.InvalidJobError("i"),
        contract.DeadlineExceededError("d"),
        contract.GraphVersionMismatchError("g"),
        contract.WorkerBusyError("b"),
    ):
        back = error_for_status(status_for_error(err), "x")
        assert type(back) is type(err)
    assert status_for_error(contract.JobError("j")) == grpc.StatusCode.INTERNAL
    assert status_for_error(KeyError("k")) == grpc.StatusCode.INTERNAL
    assert type(error_for_status(grpc.StatusCode.INTERNAL, "x")) is contract.JobError
    assert isinstance(
        error_for_status(grpc.StatusCode.UNAVAILABLE, "x"), contract.WorkerUnavailableError
    )


def test_status_round_trip():
    blocks = (BlockInfo(1, "SAGEConv", 6, 8, "block 1: ..."), BlockInfo(2, "GATConv", 8, 4))
    status = WorkerStatus(
        worker_id="w",
        device="cuda:1",
        models=(
            ModelStatus("a", "1", 4, 2, "g2", 100, "layerwise", True, blocks, "a.b:C"),
            ModelStatus(
                *("b", "3", 8, 3, "g1", 7, "nodewise", False),
                output_types=("user", "item"),
                output_dims=(4, 8),
            ),
        ),
        inflight_jobs=2,
        queued_jobs=1,
        memory=DeviceMemory(10, 100, 50),
    )
    wire = worker_pb2.WorkerInfo.FromString(status_to_proto(status).SerializeToString())
    assert status_from_proto(wire) == status  # every field, per model, graphs included
