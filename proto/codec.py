"""Contract dataclasses <-> ``hopserve.v1`` worker messages, and job errors <-> status codes.

Shared by the worker service and the remote worker client, so the two sides cannot
disagree. Field names are the contract's (:mod:`hopserve.proto.contract`) on both sides, copied
by name (:mod:`hopserve.proto.fields`); this module only packs arrays
(:mod:`hopserve.proto.tensors`), nests messages and spells "absent":

* ``Job.frontiers``: ``None`` is *no* ``frontiers`` entry; otherwise ``L + 1`` entries
  ``V^0 … V^L``, a ``None`` entry (all nodes / not planned) being **empty** ``bytes``
  (a real frontier contains the non-empty targets, so it is never empty).
* ``Job.fanouts``: ``None`` (exact) is an empty list; ``Job.seed``: ``None`` is an unset
  ``optional`` field; ``Job.deadline``: ``None`` is ``0``.
* ``JobResult.worker`` is not on the wire: the client that received it fills it in.

:func:`status_for_error` maps the contract's job errors to gRPC status codes and
:func:`error_for_status` back, so in-process and remote dispatch raise the same types.
Imports numpy, grpc and the generated stubs only (no torch).
"""

from __future__ import annotations

import math

import grpc
import numpy as np

from hopserve.proto.contract import (
    BlockInfo,
    DeadlineExceededError,
    DeviceMemory,
    GraphVersionMismatchError,
    InvalidJobError,
    Job,
    JobError,
    JobResult,
    LayerStats,
    ModelNotFoundError,
    ModelStatus,
    RunStats,
    WorkerBusyError,
    WorkerStatus,
    WorkerUnavailableError,
    validate_fanouts,
)
from hopserve.proto.fields import from_message, to_message
from hopserve.proto.tensors import (
    decode_embeddings,
    decode_indices,
    encode_embeddings,
    encode_indices,
)
from hopserve.proto.v1 import embedding_pb2, worker_pb2
from hopserve.rpc import clip

__all__ = [
    "error_for_status",
    "job_from_proto",
    "job_to_proto",
    "result_from_proto",
    "result_to_proto",
    "status_for_error",
    "status_from_proto",
    "status_to_proto",
]

_UINT64_MAX = 2**64 - 1


# ---------------------------------------------------------------------------- jobs
def job_to_proto(job: Job) -> worker_pb2.JobRequest:
    """Encode ``job``.

    Raises:
        ValueError: a field cannot be encoded (empty targets or frontier, bad fanouts,
            seed outside uint64, bad deadline).
    """
    if job.targets.size == 0:
        raise ValueError(f"job {job.job_id}: targets is empty")
    msg = worker_pb2.JobRequest(
        job_id=job.job_id,
        model=job.model,
        model_version=job.model_version,
        graph_version=job.graph_version,
        graph_seq=job.graph_seq,
        targets=encode_indices(np.asarray(job.targets)),
        delta=job.delta,
        updates=list(job.updates),
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
        msg.fanouts.extend(validate_fanouts(job.fanouts) or ())
    if job.seed is not None:
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

    Raises:
        InvalidJobError: a byte count that is not a multiple of 8, no targets, a bad
            deadline, bad fanouts, or sampling fanouts without a ``seed``.
    """
    where = f"job {clip(msg.job_id) or '<no id>'}"
    try:
        targets = decode_indices(msg.targets)
        frontiers = (
            tuple(decode_indices(f) if len(f) else None for f in msg.frontiers)
            if len(msg.frontiers)
            else None
        )
        fanouts = validate_fanouts(list(msg.fanouts))
    except ValueError as err:
        raise InvalidJobError(f"{where}: {err}") from None
    if targets.size == 0:
        raise InvalidJobError(f"{where}: targets is empty")
    if not math.isfinite(msg.deadline_unix_s) or msg.deadline_unix_s < 0:
        raise InvalidJobError(f"{where}: deadline_unix_s {msg.deadline_unix_s!r} is not a time")
    if fanouts is not None and not msg.HasField("seed"):
        raise InvalidJobError(f"{where}: seed is required when fanouts sample ({list(fanouts)})")
    return Job(
        job_id=msg.job_id,
        model=msg.model,
        model_version=msg.model_version,
        targets=targets,
        frontiers=frontiers,
        fanouts=fanouts,
        seed=msg.seed if msg.HasField("seed") else None,
        deadline=msg.deadline_unix_s or None,
        graph_version=msg.graph_version,
        graph_seq=int(msg.graph_seq),
        delta=bytes(msg.delta),
        updates=tuple(bytes(u) for u in msg.updates),
    )


# ---------------------------------------------------------------------------- results
def _stats_to_proto(s: RunStats) -> worker_pb2.JobStats:
    return to_message(
        s,
        worker_pb2.JobStats,
        frontier_sizes=[int(v) for v in s.frontier_sizes],
        layers=[to_message(layer, worker_pb2.LayerStats) for layer in s.layers],
    )


def _stats_from_proto(m: worker_pb2.JobStats) -> RunStats:
    return from_message(m, RunStats, layers=[from_message(x, LayerStats) for x in m.layers])


def result_to_proto(result: JobResult) -> worker_pb2.JobResult:
    """Encode ``result`` (float32 ``[rows, dim]`` embeddings, ``dim >= 1``).

    Raises:
        ValueError: embeddings are not a 2-D float32 array with ``dim >= 1``.
    """
    emb = result.embeddings
    return worker_pb2.JobResult(
        job_id=result.job_id,
        dim=int(emb.shape[1]),
        dtype=embedding_pb2.DTYPE_FLOAT32,
        embeddings=encode_embeddings(emb),
        num_rows=int(emb.shape[0]),
        model_version=result.model_version,
        graph_version=result.graph_version,
        graph_seq=result.graph_seq,
        stats=_stats_to_proto(result.stats),
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
    return JobResult(
        msg.job_id,
        embeddings,
        _stats_from_proto(msg.stats),
        worker=worker,
        model_version=msg.model_version,
        graph_version=msg.graph_version,
        graph_seq=int(msg.graph_seq),
    )


# ---------------------------------------------------------------------------- status
def status_to_proto(status: WorkerStatus) -> worker_pb2.WorkerInfo:
    """Encode a :class:`WorkerStatus` (``memory`` is flattened to ``device_memory_*``)."""
    models = [
        to_message(
            m,
            worker_pb2.LoadedModel,
            blocks=[to_message(b, embedding_pb2.BlockInfo) for b in m.blocks],
        )
        for m in status.models
    ]
    return to_message(
        status,
        worker_pb2.WorkerInfo,
        models=models,
        device_memory_used_bytes=status.memory.used,
        device_memory_total_bytes=status.memory.total,
        device_memory_peak_bytes=status.memory.peak,
    )


def status_from_proto(msg: worker_pb2.WorkerInfo) -> WorkerStatus:
    """Decode a ``WorkerInfo``."""
    models = tuple(
        from_message(
            m,
            ModelStatus,
            mode=m.mode or "layerwise",
            blocks=tuple(from_message(b, BlockInfo) for b in m.blocks),
            output_types=tuple(m.output_types),
            output_dims=tuple(int(d) for d in m.output_dims),
        )
        for m in msg.models
    )
    memory = DeviceMemory(
        msg.device_memory_used_bytes, msg.device_memory_total_bytes, msg.device_memory_peak_bytes
    )
    return from_message(msg, WorkerStatus, models=models, memory=memory)


# ---------------------------------------------------------------------------- errors
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
