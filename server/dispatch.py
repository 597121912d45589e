"""How the front-end reaches its workers: worker clients and the least-loaded dispatcher.

Two :class:`~hopserve.proto.contract.WorkerClient` implementations with one interface:

* :class:`InProcessWorkerClient` runs :meth:`Worker.execute` on a thread pool of this
  process (the embedded worker; also what tests use).
* :class:`RemoteWorkerClient` calls a worker's ``hopserve.v1.WorkerService`` with
  ``grpc.aio``. Unreachable worker (``UNAVAILABLE``, connection errors, the server going
  away mid-call) → :class:`WorkerUnavailableError`; any other failure → a
  :class:`JobError` subclass (the same types the in-process worker raises).

:class:`Dispatcher` sends each job to the healthy client with the fewest jobs in flight.
On :class:`WorkerUnavailableError` it marks that worker down and fails over to the next;
a down worker is tried again after ``retry_after_s`` (by the next job, or by a
background probe when ``probe_interval_s`` is set). No call can hang: every remote call
has a timeout, the job's deadline or ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

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
    DeadlineExceededError,
    InvalidJobError,
    Job,
    JobError,
    JobResult,
    WorkerBusyError,
    WorkerClient,
    WorkerStatus,
    WorkerUnavailableError,
    time_left,
)
from hopserve.proto.v1 import worker_pb2_grpc

__all__ = [
    "Dispatcher",
    "InProcessWorkerClient",
    "JobError",
    "RemoteWorkerClient",
    "WorkerUnavailableError",
]

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

    def _error(self, err: grpc.aio.AioRpcError, what: str) -> Exception:
        details = err.details() or err.code().name
        return error_for_status(err.code(), f"worker {self.name}: {what}: {details}")

    async def close(self) -> None:
        """Close the channel (in-flight calls are cancelled)."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None


class _Slot:
    """A client and its health as seen by the dispatcher."""

    def __init__(self, client: WorkerClient) -> None:
        self.client = client
        self.up = True
        self.retry_at = 0.0  # monotonic time a down worker may be tried again
        self.reason = ""


class Dispatcher:
    """Sends each job to the least-loaded healthy worker, failing over when one is down.

    Args:
        clients: the workers (unique ``name`` each).
        on_worker_state: ``callback(name, up)`` on every up/down change (and once per
            client at start-up with ``up=True``), e.g. to set ``hopserve_worker_up``.
        retry_after_s: how long a worker stays marked down before it is tried again.
        probe_interval_s: when set, a background task (started by :meth:`start` or the
            first :meth:`run`) probes down workers with ``status()`` this often, so they
            come back without waiting for traffic.
    """

    def __init__(
        self,
        clients: Sequence[WorkerClient],
        *,
        on_worker_state: Callable[[str, bool], None] | None = None,
        retry_after_s: float = 0.5,
        probe_interval_s: float | None = None,
    ) -> None:
        if not clients:
            raise ValueError("Dispatcher needs at least one worker client")
        names = [c.name for c in clients]
        if len(set(names)) != len(names):
            raise ValueError(f"worker client names must be unique, got {names}")
        self._slots = [_Slot(c) for c in clients]
        self._on_state = on_worker_state
        self.retry_after_s = retry_after_s
        self.probe_interval_s = probe_interval_s
        self._turn = itertools.count()  # round-robin among equally loaded workers
        self._probe_task: asyncio.Task[None] | None = None
        for slot in self._slots:
            self._notify(slot.client.name, True)

    @property
    def clients(self) -> list[WorkerClient]:
        return [s.client for s in self._slots]

    def states(self) -> dict[str, bool]:
        """``{name: up}`` for every worker."""
        return {s.client.name: s.up for s in self._slots}

    async def run(self, job: Job) -> JobResult:
        """Run ``job`` on the least-loaded healthy worker, failing over on unavailability.

        Raises:
            WorkerUnavailableError: no worker could take the job (message lists why).
            JobError: the job failed on a worker (not retried elsewhere), or every
                reachable worker was busy (:class:`WorkerBusyError`).
        """
        self._ensure_probe()
        tried: list[str] = []
        attempted: set[str] = set()
        busy: WorkerBusyError | None = None
        for slot in self._candidates():
            name = slot.client.name
            attempted.add(name)
            try:
                result = await slot.client.run(job)
            except WorkerUnavailableError as err:
                self._mark_down(slot, str(err))
                tried.append(f"{name}: {err}")
                continue
            except WorkerBusyError as err:
                busy = err
                tried.append(f"{name}: busy")
                continue
            except JobError:
                self._mark_up(slot)  # it answered: reachable
                raise
            self._mark_up(slot)
            return result
        if busy is not None:
            raise busy
        now = time.monotonic()
        for slot in self._slots:
            if not slot.up and slot.client.name not in attempted:
                wait = max(0.0, slot.retry_at - now)
                tried.append(f"{slot.client.name}: down ({slot.reason}; retry in {wait:.1f}s)")
        raise WorkerUnavailableError(f"no worker available: {'; '.join(tried)}")

    def _candidates(self) -> list[_Slot]:
        """Up workers by load, then down workers whose retry time has come."""
        now = time.monotonic()
        turn = next(self._turn)
        n = len(self._slots)
        order = {id(s): (i - turn) % n for i, s in enumerate(self._slots)}
        up = [s for s in self._slots if s.up]
        due = [s for s in self._slots if not s.up and s.retry_at <= now]
        up.sort(key=lambda s: (s.client.inflight, order[id(s)]))
        due.sort(key=lambda s: s.retry_at)
        return up + due

    def _mark_down(self, slot: _Slot, reason: str) -> None:
        slot.retry_at = time.monotonic() + self.retry_after_s
        slot.reason = reason
        if slot.up:
            slot.up = False
            log.warning("worker %s is down: %s", slot.client.name, reason)
            self._notify(slot.client.name, False)

    def _mark_up(self, slot: _Slot) -> None:
        if not slot.up:
            slot.up = True
            slot.reason = ""
            log.info("worker %s is back up", slot.client.name)
            self._notify(slot.client.name, True)

    def _notify(self, name: str, up: bool) -> None:
        if self._on_state is not None:
            try:
                self._on_state(name, up)
            except Exception:  # a metrics callback must not break dispatch
                log.exception("on_worker_state callback failed for %s", name)

    # ------------------------------------------------------------------ probing
    def start(self) -> None:
        """Start the background probe (if ``probe_interval_s`` is set); needs a loop."""
        self._ensure_probe()

    def _ensure_probe(self) -> None:
        if self.probe_interval_s is None or self._probe_task is not None:
            return
        self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())

    async def probe(self) -> None:
        """Probe every down worker whose retry time has come (``status()`` call)."""
        now = time.monotonic()
        for slot in self._slots:
            if slot.up or slot.retry_at > now:
                continue
            try:
                await slot.client.status()
            except WorkerUnavailableError as err:
                self._mark_down(slot, str(err))
            except Exception as err:  # answered, just not happily: it is reachable
                log.debug("probe of %s: %s", slot.client.name, err)
                self._mark_up(slot)
            else:
                self._mark_up(slot)

    async def _probe_loop(self) -> None:
        assert self.probe_interval_s is not None
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self.probe()
            except Exception:  # keep probing whatever happens
                log.exception("worker probe failed")

    async def close(self) -> None:
        """Stop probing and close every client."""
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        for slot in self._slots:
            await slot.client.close()
