"""The worker's gRPC service: ``hopserve.v1.WorkerService`` over a :class:`Worker`.

``RunJob`` decodes the request (:mod:`hopserve.proto.codec`), runs
:meth:`Worker.execute` on the server's thread pool and encodes the result. Failures
never escape as crashes: every exception becomes a status code in one place
(:func:`hopserve.proto.codec.status_for_error`): unknown model ``NOT_FOUND``, malformed
job ``INVALID_ARGUMENT``, graph version mismatch ``FAILED_PRECONDITION``, deadline
``DEADLINE_EXCEEDED``, too many pending jobs ``RESOURCE_EXHAUSTED``, anything else
``INTERNAL`` (logged with its traceback when it is not a :class:`JobError`).

Request bytes that are not a valid message are answered ``INVALID_ARGUMENT`` before the
servicer runs (:func:`hopserve.rpc.add_service`). Status details are bounded
(:func:`hopserve.rpc.bound_message`) and client values in them cut
(:func:`hopserve.rpc.clip`, :func:`~hopserve.rpc.quote`), so an answer always fits gRPC's
metadata limit. Repeated identical warnings are rate-limited (:mod:`hopserve.logs`).

``LoadModel`` / ``UnloadModel`` load and unload model versions while the worker serves
(the front-end's hot swaps): a load that fails is ``INVALID_ARGUMENT`` naming why.

The server also answers ``grpc.health.v1.Health`` (service ``""`` and
``hopserve.v1.WorkerService``; ``NOT_SERVING`` once shutdown begins) and server
reflection.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
from google.protobuf import empty_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hopserve.logs import rate_limited
from hopserve.proto.codec import (
    job_from_proto,
    result_to_proto,
    status_for_error,
    status_to_proto,
)
from hopserve.proto.contract import JobError, ModelStatus, WorkerBusyError
from hopserve.proto.fields import to_message
from hopserve.proto.v1 import embedding_pb2, worker_pb2, worker_pb2_grpc
from hopserve.rpc import add_service, bind_port, bound_message, clip
from hopserve.security.gate import Gate
from hopserve.worker.runtime.base import Worker

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.config import EngineConfig

__all__ = ["SERVICE_NAME", "WorkerServer", "WorkerServicer", "serve_worker"]

log = rate_limited(__name__)

#: Full protobuf name of the worker service (also its health-check service name).
SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """Serves one :class:`Worker`.

    Args:
        worker: the worker that runs the jobs.
        max_pending_jobs: jobs accepted at once (running or waiting for their model);
            more are refused with ``RESOURCE_EXHAUSTED`` so the dispatcher can go elsewhere.
        engine: the evaluator settings of models loaded through ``LoadModel``.
    """

    def __init__(
        self, worker: Worker, *, max_pending_jobs: int = 16, engine: EngineConfig | None = None
    ) -> None:
        if max_pending_jobs < 1:
            raise ValueError(f"max_pending_jobs must be >= 1, got {max_pending_jobs}")
        self.worker = worker
        self.engine = engine
        self.max_pending_jobs = max_pending_jobs
        self._pending = 0
        self._lock = threading.Lock()

    def RunJob(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.JobRequest, context: grpc.ServicerContext
    ) -> worker_pb2.JobResult:
        with self._lock:
            busy = self._pending >= self.max_pending_jobs
            if not busy:
                self._pending += 1
        if busy:
            return self._fail(
                context,
                WorkerBusyError(
                    f"worker {self.worker.worker_id}: {self.max_pending_jobs} jobs pending"
                ),
                request.job_id,
            )
        try:
            return self._run(request, context)
        except Exception as err:  # never let a job take the process down
            return self._fail(context, err, request.job_id)
        finally:
            with self._lock:
                self._pending -= 1

    def _run(
        self, request: worker_pb2.JobRequest, context: grpc.ServicerContext
    ) -> worker_pb2.JobResult:
        job = job_from_proto(request)
        remaining = context.time_remaining()
        if job.deadline is None and remaining is not None:  # the call's deadline
            job = dataclasses.replace(job, deadline=time.time() + remaining)
        return result_to_proto(self.worker.execute(job))

    def _fail(
        self, context: grpc.ServicerContext, err: Exception, job_id: str
    ) -> worker_pb2.JobResult:
        code = status_for_error(err)
        job = clip(job_id)
        if isinstance(err, JobError):
            details = bound_message(str(err))
            log.info("job %s: %s: %s", job, code.name, details)
        else:
            log.exception("job %s: unexpected error", job)
            details = bound_message(f"job {job}: worker error: {type(err).__name__}: {err}")
        context.set_code(code)
        context.set_details(details)
        return worker_pb2.JobResult()

    def WorkerStatus(  # noqa: N802 - gRPC method name
        self, request: empty_pb2.Empty, context: grpc.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        status = self.worker.status()
        with self._lock:
            pending = self._pending
        msg = status_to_proto(status)
        # Jobs accepted by the service but not yet running include those waiting for a
        # server thread, which the worker itself cannot see.
        msg.queued_jobs = max(msg.queued_jobs, pending - msg.inflight_jobs)
        return msg

    def LoadModel(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.WorkerLoadModelRequest, context: grpc.ServicerContext
    ) -> worker_pb2.LoadedModel:
        from pydantic import ValidationError

        from hopserve.config import ModelConfig
        from hopserve.worker.loader import ModelLoadError

        try:
            cfg = ModelConfig.model_validate_json(request.config)
            loaded = self.worker.load_model(cfg, self.engine)
        except (ValidationError, ModelLoadError, ValueError) as err:
            details = bound_message(f"cannot load the model: {err}")
            log.info("LoadModel: %s", details)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)
        except Exception as err:  # never let a load take the process down
            log.exception("LoadModel failed")
            context.abort(
                grpc.StatusCode.INTERNAL,
                bound_message(f"loading the model failed: {type(err).__name__}: {err}"),
            )
        return model_status_to_proto(loaded.status())

    def UnloadModel(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.WorkerUnloadModelRequest, context: grpc.ServicerContext
    ) -> empty_pb2.Empty:
        self.worker.unload_model(request.name, request.version, timeout=60.0)
        return empty_pb2.Empty()


def model_status_to_proto(status: ModelStatus) -> worker_pb2.LoadedModel:
    """One loaded model as a ``LoadedModel`` message (as in ``WorkerInfo.models``)."""
    blocks = [to_message(b, embedding_pb2.BlockInfo) for b in status.blocks]
    return to_message(status, worker_pb2.LoadedModel, blocks=blocks)


class WorkerServer:
    """A running worker gRPC server (returned by :func:`serve_worker`)."""

    def __init__(self, server: grpc.Server, health_servicer: health.HealthServicer) -> None:
        self.grpc_server = server
        self.health = health_servicer

    def stop(self, grace: float | None = None) -> threading.Event:
        """Report ``NOT_SERVING``, then stop; in-flight jobs get ``grace`` seconds."""
        self.health.enter_graceful_shutdown()
        return self.grpc_server.stop(grace)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout``); ``True`` if it timed out."""
        return self.grpc_server.wait_for_termination(timeout)


def serve_worker(
    worker: Worker,
    host: str = "127.0.0.1",
    port: int = 50052,
    *,
    max_pending_jobs: int = 16,
    credentials: grpc.ServerCredentials | None = None,
    gate: Gate | None = None,
    engine: EngineConfig | None = None,
) -> tuple[WorkerServer, int]:
    """Start a gRPC server for ``worker`` on ``host:port`` (``port=0`` picks a free one).

    ``engine``: the evaluator settings of models loaded later (``LoadModel``).
    ``credentials`` (mutual TLS) and ``gate`` (the link token) come from
    :func:`hopserve.security.factory.worker_credentials` / ``worker_gate``; without them
    the port is plaintext and open, which suits loopback only.

    Returns:
        ``(server, bound_port)``; the server is started.

    Raises:
        RuntimeError: the address cannot be bound.
    """
    threads = max_pending_jobs + 4  # headroom for status and health calls
    server = grpc.server(
        ThreadPoolExecutor(threads, thread_name_prefix="hopserve-worker-rpc"),
        options=[
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ],
    )
    servicer = WorkerServicer(worker, max_pending_jobs=max_pending_jobs, engine=engine)
    add_service(
        server, servicer, worker_pb2.DESCRIPTOR.services_by_name["WorkerService"], gate=gate
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    bound, address = bind_port(server, host, port, credentials)
    if bound == 0:
        raise RuntimeError(f"worker: cannot listen on {address}")
    server.start()
    log.info("worker %s listening on %s:%d", worker.worker_id, address.rsplit(":", 1)[0], bound)
    return WorkerServer(server, health_servicer), bound
