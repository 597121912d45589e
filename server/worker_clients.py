"""The front-end's two ways to reach a worker, behind one interface
(:class:`~hopserve.proto.contract.WorkerClient`; :mod:`hopserve.server.dispatch` picks one):

* :class:`InProcessWorkerClient` runs :meth:`Worker.execute` on a thread pool of this
  process (the embedded worker; also what tests use).
* :class:`RemoteWorkerClient` calls a worker's ``hopserve.v1.WorkerService`` with
  ``grpc.aio``, over the link's credentials when ``security.link`` is set (mutual TLS,
  re-read when the certificate files change, and the link token). Unreachable worker
  (``UNAVAILABLE``, connection errors, the server going away mid-call) →
  :class:`WorkerUnavailableError`; any other failure → a :class:`JobError` subclass (the
  same types the in-process worker raises). Every call has a timeout: the job's deadline
  or ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import grpc.aio
from google.protobuf import empty_pb2

from hopserve.proto.codec import (
    error_for_status,
    job_to_proto,
    result_from_proto,
    status_from_proto,
)
from hopserve.proto.contract import (
    BlockInfo,
    DeadlineExceededError,
    InvalidJobError,
    Job,
    JobError,
    JobResult,
    ModelStatus,
    WorkerStatus,
    WorkerUnavailableError,
    time_left,
)
from hopserve.proto.fields import from_message
from hopserve.proto.v1 import worker_pb2, worker_pb2_grpc

if TYPE_CHECKING:  # pragma: no cover
    from hopserve.config import ModelConfig

__all__ = ["ChannelCredentialSource", "InProcessWorkerClient", "RemoteWorkerClient"]

log = logging.getLogger(__name__)


class InProcessWorkerClient:
    """A :class:`Worker` in this process, reached through a thread pool.

    Args:
        worker: the worker (its models loaded).
        max_concurrency: jobs executed at once; more wait in the pool's queue.
        name: client name (default: the worker's id).
    """

    def __init__(self, worker: Any, *, max_concurrency: int = 1, name: str | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.worker = worker
        self.name = name or worker.worker_id
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="hopserve-inproc")
        self._inflight = 0  # touched only on the event loop's thread
        self._closed = False

    @property
    def inflight(self) -> int:
        """Jobs submitted and not yet finished."""
        return self._inflight

    async def run(self, job: Job) -> JobResult:
        """Run ``job`` on the worker's thread pool (see :meth:`Worker.execute` for errors)."""
        if self._closed:
            raise WorkerUnavailableError(f"worker {self.name}: client is closed")
        loop = asyncio.get_running_loop()
        self._inflight += 1
        try:
            result = await loop.run_in_executor(self._pool, self.worker.execute, job)
        finally:
            self._inflight -= 1
        result.worker = self.name
        return result

    async def status(self) -> WorkerStatus:
        """The worker's :meth:`Worker.status`."""
        return self.worker.status()

    async def close(self) -> None:
        """Stop accepting jobs and wait for the running ones (the worker stays open)."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)


class ChannelCredentialSource(Protocol):
    """Channel credentials that may change (``hopserve.security.tls.ChannelCredentialFiles``)."""

    def current(self) -> grpc.ChannelCredentials: ...


class RemoteWorkerClient:
    """A worker's ``WorkerService`` over gRPC (``grpc.aio``).

    Args:
        address: ``"host:port"``.
        timeout_s: call timeout for jobs without a deadline.
        status_timeout_s: timeout of :meth:`status` calls.
        name: client name (default: ``address``).
        channel_options: extra gRPC channel options. By default the channel reconnects
            at most 0.5 s after a worker comes back (gRPC's default backoff grows to 120 s).
        credentials: TLS credentials of the link (mutual TLS), or an object whose
            ``current()`` gives them (re-read when their files change: a new channel is
            opened with the new ones, the old one closes once its calls are done); None
            for plaintext.
        metadata: called before every call for the metadata to send (the link token's
            ``authorization`` header, re-read when its file changes).

    The channel is created on first use, in the running event loop.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 60.0,
        status_timeout_s: float = 2.0,
        name: str | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | ChannelCredentialSource | None = None,
        metadata: Callable[[], Sequence[tuple[str, str]]] = tuple,
    ) -> None:
        self.address = address
        self._credentials = credentials
        self._metadata = metadata
        self.name = name or address
        self.timeout_s = timeout_s
        self.status_timeout_s = status_timeout_s
        self._options = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
            *channel_options,
        ]
        self._channel: grpc.aio.Channel | None = None
        self._channel_credentials: grpc.ChannelCredentials | None = None
        self._stub: worker_pb2_grpc.WorkerServiceStub | None = None
        self._inflight = 0

    @property
    def inflight(self) -> int:
        """Calls sent and not yet answered."""
        return self._inflight

    def _get_stub(self) -> worker_pb2_grpc.WorkerServiceStub:
        credentials = self._credentials
        if credentials is not None and not isinstance(credentials, grpc.ChannelCredentials):
            credentials = credentials.current()
            if self._stub is not None and credentials is not self._channel_credentials:
                old, self._stub = self._channel, None  # rotated: new calls, new channel
                asyncio.ensure_future(old.close(grace=self.timeout_s))  # type: ignore[union-attr]
        if self._stub is None:
            if credentials is None:
                self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(
                    self.address, credentials, options=self._options
                )
            self._channel_credentials = credentials
            self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        return self._stub

    async def run(self, job: Job) -> JobResult:
        """Run ``job`` on the remote worker.

        Raises:
            WorkerUnavailableError: the worker cannot be reached or went away.
            DeadlineExceededError: ``job.deadline`` passed (before or during the call).
            JobError: any other failure (subclass by status code).
        """
        left = time_left(job)
        if left is not None and left <= 0:
            raise DeadlineExceededError(f"job {job.job_id}: deadline passed before dispatch")
        timeout = self.timeout_s if left is None else left
        try:
            request = job_to_proto(job)
        except ValueError as err:  # the in-process worker refuses the same jobs
            raise InvalidJobError(str(err)) from None
        self._inflight += 1
        try:
            reply = await self._get_stub().RunJob(
                request, timeout=timeout, metadata=self._metadata()
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err, f"job {job.job_id}") from None
        except (grpc.aio.UsageError, OSError) as err:  # closed channel, socket errors
            raise WorkerUnavailableError(f"worker {self.name}: {err}") from None
        finally:
            self._inflight -= 1
        try:
            result = result_from_proto(reply, worker=self.name)
        except ValueError as err:
            raise JobError(f"worker {self.name}: malformed result: {err}") from None
        if result.job_id != job.job_id or result.embeddings.shape[0] != job.targets.size:
            raise JobError(
                f"worker {self.name}: result for job {result.job_id!r} with "
                f"{result.embeddings.shape[0]} rows does not answer job {job.job_id!r} "
                f"({job.targets.size} targets)"
            )
        return result

    async def status(self) -> WorkerStatus:
        """The worker's ``WorkerStatus``.

        Raises:
            WorkerUnavailableError: the worker cannot be reached within ``status_timeout_s``.
        """
        try:
            reply = await self._get_stub().WorkerStatus(
                empty_pb2.Empty(), timeout=self.status_timeout_s, metadata=self._metadata()
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise WorkerUnavailableError(
                    f"worker {self.name}: no status within {self.status_timeout_s}s"
                ) from None
            raise self._error(err, "status") from None
        except (grpc.aio.UsageError, OSError) as err:
            raise WorkerUnavailableError(f"worker {self.name}: {err}") from None
        return status_from_proto(reply)

    async def load_model(self, config: ModelConfig, timeout: float = 600.0) -> ModelStatus:
        """Load a model version on the remote worker (``WorkerService.LoadModel``); its
        report.

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
            JobError: the worker refused or failed the load (the message says why).
        """
        data = config.model_dump(mode="json")
        data["config_dir"] = None if config.config_dir is None else str(config.config_dir)
        request = worker_pb2.WorkerLoadModelRequest(config=json.dumps(data))
        try:
            reply = await self._get_stub().LoadModel(
                request, timeout=timeout, metadata=self._metadata()
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err, f"load {config.name}:{config.version}") from None
        except (grpc.aio.UsageError, OSError) as err:
            raise WorkerUnavailableError(f"worker {self.name}: {err}") from None
        return from_message(
            reply,
            ModelStatus,
            mode=reply.mode or "layerwise",
            blocks=tuple(from_message(b, BlockInfo) for b in reply.blocks),
        )

    async def unload_model(self, name: str, version: str, timeout: float = 120.0) -> None:
        """Unload a model version from the remote worker (idempotent).

        Raises:
            WorkerUnavailableError: the worker cannot be reached.
            JobError: the worker failed the call.
        """
        request = worker_pb2.WorkerUnloadModelRequest(name=name, version=version)
        try:
            await self._get_stub().UnloadModel(request, timeout=timeout, metadata=self._metadata())
        except grpc.aio.AioRpcError as err:
            raise self._error(err, f"unload {name}:{version}") from None
        except (grpc.aio.UsageError, OSError) as err:
            raise WorkerUnavailableError(f"worker {self.name}: {err}") from None

    def _error(self, err: grpc.aio.AioRpcError, what: str) -> Exception:
        details = err.details() or err.code().name
        return error_for_status(err.code(), f"worker {self.name}: {what}: {details}")

    async def close(self) -> None:
        """Close the channel (in-flight calls are cancelled)."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None
