"""How the front-end picks a worker: the least-loaded dispatcher with failover.

The clients it drives (in-process and remote, one interface) are in
:mod:`hopserve.server.worker_clients`. :class:`Dispatcher` sends each job to the healthy client with the fewest jobs in flight.
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

from hopserve.proto.contract import (
    Job,
    JobError,
    JobResult,
    WorkerBusyError,
    WorkerClient,
    WorkerUnavailableError,
)

__all__ = ["Dispatcher", "JobError", "WorkerUnavailableError"]

log = logging.getLogger(__name__)


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
