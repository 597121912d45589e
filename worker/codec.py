"""Job / JobResult / worker status <-> ``hopserve.v1`` worker protobufs, and error codes.

Shared by the worker service and the remote worker client, so the two sides cannot
disagree. Imports numpy, grpc and the generated stubs only (no torch).

Wire encoding (``worker.proto``):

* Index arrays are packed little-endian int64 (``<i8``) ``bytes``; embeddings packed
  little-endian float32 (``<f4``), row-major, with ``num_rows`` and ``dim`` in their own
  fields (:mod:`hopserve.client.wire`). Lengths are validated on decode.
* ``Job.frontiers``: ``None`` (the worker plans) is *no* ``frontiers`` entry. Otherwise
  one entry per layer, **all of** ``V^0 … V^L`` (``L + 1`` entries, the
  :class:`~hopserve.worker.job.Job` contract), and a ``None`` entry (*all nodes*) is an
  **empty** ``bytes``. That is unambiguous: every frontier contains the (non-empty)
  targets, so a real frontier is never empty; encoding refuses empty arrays. Workers
  also accept the ``L``-entry form ``V^1 … V^L`` and derive ``V^0``.
* ``fanouts``: ``None`` (exact) is an empty list; ``seed`` is always set (a job whose
  fanouts sample must carry one); ``deadline``: ``None`` is ``0``.
* ``JobStats``: every field has a wire field (``oom_retries`` travels as
  ``oom_halvings``); ``frontier_sizes`` carries all ``L + 1`` sizes ``|V^0| … |V^L|`` and
  ``layer_compute`` one entry per evaluated block, as in :class:`JobStats`.
* ``JobResult.worker`` is not on the wire: the client that received it fills it in.

Errors (one place): :func:`status_for_error` maps worker exceptions to gRPC status codes,
:func:`error_for_status` maps them back to the same exception types.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
import numpy as np

from hopserve.client.wire import (
    decode_embeddings,
    decode_indices,
    encode_embeddings,
    encode_indices,
)
from hopserve.proto.v1 import embedding_pb2, worker_pb2
from hopserve.rpc import clip
from hopserve.worker.job import Job, JobError, JobResult, JobStats, WorkerUnavailableError
from hopserve.worker.runtime.errors import (
    DeadlineExceededError,
    GraphVersionMismatchError,
    InvalidJobError,
    ModelNotFoundError,
    WorkerBusyError,
)

__all__ = [
    "error_for_status",
    "info_from_proto",
    "info_to_proto",
    "job_from_proto",
    "job_to_proto",
    "result_from_proto",
    "result_to_proto",
    "status_for_error",
]

_INT32 = (-(2**31), 2**31 - 1)
_UINT64_MAX = 2**64 - 1


# ---------------------------------------------------------------------- jobs
def job_to_proto(job: Job, *, graph_version: str = "") -> worker_pb2.JobRequest:
    """Encode ``job``; ``graph_version`` (optional) is checked by the worker.

    Raises:
        ValueError: a field cannot be encoded (empty targets or frontier, empty
            ``fanouts`` tuple, seed outside uint64, fanout outside int32, bad deadline).
    """
    if job.targets.size == 0:
        raise ValueError(f"job {job.job_id}: targets is empty")
    msg = worker_pb2.JobRequest(
        job_id=job.job_id,
        model=job.model,
        model_version=job.model_version,
        graph_version=graph_version,
        targets=encode_indices(np.asarray(job.targets)),
    )
    if job.frontiers is not None:
        if len(job.frontiers) == 0:
            raise ValueError(f"job {job.job_id}: frontiers is an empty tuple (use None)")
        for layer, f in enumerate(job.frontiers):
            if f is not None and np.asarray(f).size == 0:
                raise ValueError(
                    f"job {job.job_id}: frontier V^{layer} is empty (None means all nodes)"
                )
            msg.frontiers.append(b"" if f is None else encode_indices(np.asarray(f)))
    if job.fanouts is not None:
        if len(job.fanouts) == 0:
            raise ValueError(f"job {job.job_id}: fanouts is an empty tuple (use None)")
        bad = [f for f in job.fanouts if not _INT32[0] <= int(f) <= _INT32[1]]
        if bad:
            raise ValueError(f"job {job.job_id}: fanout {bad[0]} does not fit int32")
        msg.fanouts.extend(int(f) for f in job.fanouts)
    if not 0 <= int(job.seed) <= _UINT64_MAX:
        raise ValueError(f"job {job.job_id}: seed {job.seed} is outside 0..2**64-1")
    msg.seed = int(job.seed)
    if job.deadline is not None:
        if not (math.isfinite(job.deadline) and job.deadline > 0):
            raise ValueError(f"job {job.job_id}: deadline {job.deadline!r} is not a time")
        msg.deadline_unix_s = float(job.deadline)
    return msg


def job_from_proto(msg: worker_pb2.JobRequest) -> Job:
    """Decode a ``JobRequest`` (arrays are read-only zero-copy views over the message).

    ``graph_version`` is not part of :class:`Job`; the service checks it separately.

    Raises:
        InvalidJobError: a byte count that is not a multiple of 8, no targets, a bad
            deadline, or sampling ``fanouts`` (an entry other than -1) without a ``seed``.
    """
    where = f"job {clip(msg.job_id) or '<no id>'}"
    try:
        targets = decode_indices(msg.targets)
        frontiers = (
            tuple(decode_indices(f) if len(f) else None for f in msg.frontiers)
            if len(msg.frontiers)
            else None
        )
    except ValueError as err:
        raise InvalidJobError(f"{where}: {err}") from None
    if targets.size == 0:
        raise InvalidJobError(f"{where}: targets is empty")
    if not math.isfinite(msg.deadline_unix_s) or msg.deadline_unix_s < 0:
        raise InvalidJobError(f"{where}: deadline_unix_s {msg.deadline_unix_s!r} is not a time")
    sampling = [(i, f) for i, f in enumerate(msg.fanouts) if f != -1]
    if sampling and not msg.HasField("seed"):
        i, f = sampling[0]
        raise InvalidJobError(
            f"{where}: seed is required when fanouts sample (fanouts[{i}] is {f})"
        )
    return Job(
        job_id=msg.job_id,
        model=msg.model,
        model_version=msg.model_version,
        targets=targets,
        frontiers=frontiers,
        fanouts=tuple(msg.fanouts) if len(msg.fanouts) else None,
        seed=msg.seed if msg.HasField("seed") else 0,
        deadline=msg.deadline_unix_s or None,
    )


# ---------------------------------------------------------------------- results
def result_to_proto(
    result: JobResult, *, model_version: str = "", graph_version: str = "", device: str = ""
) -> worker_pb2.JobResult:
    """Encode ``result`` (float32 ``[rows, dim]`` embeddings, ``dim >= 1``).

    Raises:
        ValueError: embeddings are not a 2-D float32 array with ``dim >= 1``.
    """
    emb = result.embeddings
    payload = encode_embeddings(emb)
    s = result.stats
    stats = worker_pb2.JobStats(
        prepare=s.prepare_s,
        planning=s.planning_s,
        peak_bytes=int(s.peak_bytes),
        oom_halvings=int(s.oom_retries),
        transfer=s.transfer_s,
        compute=s.compute_s,
        write_out=s.write_out_s,
        total=s.total_s,
        batches=int(s.batches),
        frontier_sizes=[int(v) for v in s.frontier_sizes],
        layer_compute=[float(v) for v in s.layer_compute_s],
        device=device,
    )
    return worker_pb2.JobResult(
        job_id=result.job_id,
        dim=int(emb.shape[1]),
        dtype=embedding_pb2.DTYPE_FLOAT32,
        embeddings=payload,
        num_rows=int(emb.shape[0]),
        model_version=model_version,
        graph_version=graph_version,
        stats=stats,
    )


def result_from_proto(msg: worker_pb2.JobResult, *, worker: str = "") -> JobResult:
    """Decode a ``JobResult``; embeddings are a read-only zero-copy ``<f4`` view.

    Raises:
        ValueError: wrong dtype, ``dim``/``num_rows`` out of range or a payload whose
            length does not match ``num_rows * dim * 4``.
    """
    if msg.dtype != embedding_pb2.DTYPE_FLOAT32:
        try:
            name = embedding_pb2.DType.Name(msg.dtype)
        except ValueError:
            name = str(msg.dtype)
        raise ValueError(f"job {msg.job_id}: embeddings dtype {name} (expected DTYPE_FLOAT32)")
    embeddings = decode_embeddings(msg.embeddings, int(msg.num_rows), int(msg.dim))
    s = msg.stats
    stats = JobStats(
        prepare_s=s.prepare,
        planning_s=s.planning,
        peak_bytes=s.peak_bytes,
        oom_retries=s.oom_halvings,
        transfer_s=s.transfer,
        compute_s=s.compute,
        write_out_s=s.write_out,
        total_s=s.total,
        batches=s.batches,
        frontier_sizes=list(s.frontier_sizes),
        layer_compute_s=list(s.layer_compute),
    )
    return JobResult(msg.job_id, embeddings, stats, worker=worker)


# ---------------------------------------------------------------------- status
def info_to_proto(info: dict[str, Any]) -> worker_pb2.WorkerInfo:
    """Encode :meth:`Worker.info` output.

    ``graph_version``: the models' graph versions, sorted, unique and comma-separated
    (one version in the usual one-graph deployment). Per-model graph versions, node counts
    and the peak memory have no field.
    """
    models = info.get("models", [])
    versions = sorted({m["graph_version"] for m in models if m.get("graph_version")})
    return worker_pb2.WorkerInfo(
        worker_id=info.get("worker_id", ""),
        device=info.get("device", ""),
        models=[
            worker_pb2.LoadedModel(
                name=m["name"],
                version=m["version"],
                dim=m["dim"],
                num_layers=m["num_layers"],
                graph_version=m.get("graph_version", ""),
                graph_num_nodes=int(m.get("num_nodes", m.get("graph_num_nodes", 0))),
                input_frontier=bool(m.get("input_frontier", True)),
            )
            for m in models
        ],
        inflight_jobs=int(info.get("inflight_jobs", 0)),
        queued_jobs=int(info.get("queued_jobs", 0)),
        device_memory_used_bytes=int(info.get("device_memory_used_bytes", 0)),
        device_memory_total_bytes=int(info.get("device_memory_total_bytes", 0)),
        device_memory_peak_bytes=int(info.get("device_memory_peak_bytes", 0)),
        graph_version=",".join(versions),
    )


def info_from_proto(msg: worker_pb2.WorkerInfo) -> dict[str, Any]:
    """Decode ``WorkerInfo`` into the :meth:`Worker.info` shape (fields the wire carries).

    ``graph_versions`` lists the comma-separated ``graph_version``; when there is exactly
    one, every model entry gets it as its ``graph_version`` too.
    """
    versions = [v for v in msg.graph_version.split(",") if v]
    models = []
    for m in msg.models:
        entry = {
            "name": m.name,
            "version": m.version,
            "dim": m.dim,
            "num_layers": m.num_layers,
            "graph_version": m.graph_version or (versions[0] if len(versions) == 1 else ""),
            "num_nodes": m.graph_num_nodes,
            "input_frontier": m.input_frontier,
        }
        models.append(entry)
    return {
        "worker_id": msg.worker_id,
        "device": msg.device,
        "models": models,
        "inflight_jobs": msg.inflight_jobs,
        "queued_jobs": msg.queued_jobs,
        "device_memory_used_bytes": msg.device_memory_used_bytes,
        "device_memory_total_bytes": msg.device_memory_total_bytes,
        "device_memory_peak_bytes": msg.device_memory_peak_bytes,
        "graph_versions": versions,
    }


# ---------------------------------------------------------------------- errors
_STATUS_OF_ERROR: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (InvalidJobError, grpc.StatusCode.INVALID_ARGUMENT),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (GraphVersionMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (WorkerBusyError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (JobError, grpc.StatusCode.INTERNAL),  # the evaluation itself failed
)

_ERROR_OF_STATUS: dict[grpc.StatusCode, type[Exception]] = {
    code: cls for cls, code in _STATUS_OF_ERROR if cls is not JobError
}
# The worker is gone or going away: the dispatcher may fail over.
_UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


def status_for_error(err: BaseException) -> grpc.StatusCode:
    """The gRPC status a worker answers for ``err`` (``INTERNAL`` for anything unknown)."""
    for cls, code in _STATUS_OF_ERROR:
        if isinstance(err, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_for_status(code: grpc.StatusCode, message: str) -> Exception:
    """The exception a client raises for a failed call (inverse of :func:`status_for_error`).

    ``UNAVAILABLE`` and ``CANCELLED`` (the server went away mid-call) give
    :class:`WorkerUnavailableError`; every other code a :class:`JobError` (subclass).
    """
    if code in _UNAVAILABLE:
        return WorkerUnavailableError(message)
    return _ERROR_OF_STATUS.get(code, JobError)(message)
