"""Dynamic batcher of one model: coalesce concurrent requests into one job per batch.

Triton's dynamic batcher, specialised for GNNs: requests that share target nodes (and,
through the planner, neighbourhoods) share work. Contract of :meth:`Batcher.submit`:

* Only requests with the same :class:`BatchKey` (fanouts, seed) coalesce.
* The edge submits unique ascending storage ids (it deduplicated them once) and they are
  used as they are; other input (any order, duplicates) is deduplicated here.
* A batch collects submissions for up to ``max_wait_s`` after its first arrival, or until
  the waiting requests carry ``max_batch_targets`` targets; it takes the oldest waiting
  requests whose union has at most ``max_batch_targets`` targets. A target wanted by
  several requests is computed once: the union of a shared batch is formed once, and each
  request gets its rows back by ``searchsorted`` (a batch of one request is used as is). A
  request with more targets than ``max_batch_targets`` is split into parts of at most
  that many, each batched on its own.
* At most ``max_queue`` requests wait per model (:class:`QueueFullError` beyond), and at
  most ``max_inflight`` batches run at once; the next batch accumulates meanwhile.
* A request whose deadline passes (or whose caller is cancelled) leaves at once with
  :class:`DeadlineExceededError` (or ``CancelledError``): its targets are dropped from the
  pending batch, and a batch nobody needs any more is not dispatched, or is cancelled if
  it is already running.

Slot ownership: a batch holds one of the ``max_inflight`` slots from the moment its task
is created until the task is *done*, whatever happens to it: the slot is returned by the
task's done-callback, which asyncio runs even for a task cancelled before its first step.
The same callback fails whatever parts are still waiting, so no request outlives its batch.

Stall: :meth:`Batcher.stalled` is true while work waits or runs and no batch has finished
(with rows or an error; a cancelled batch does not count) for ``stall_after_s``; the
service turns the model's health NOT_SERVING and sets ``hopserve_model_stalled`` then.

Deadlines are absolute instants of the event loop's clock (``loop.time()``, monotonic).

One module (about 440 lines, a third of them this contract): submit, the dispatch loop
and slot ownership share the batcher's state; batch formation is in ``batch_queue.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from hopserve.server.batch_queue import (
    PendingBatch,
    PendingGroup,
    PendingPart,
    PendingRequest,
)
from hopserve.server.errors import DeadlineExceededError, QueueFullError, ShuttingDownError
from hopserve.server.metrics import Metrics
from hopserve.server.timing import StageTimes

__all__ = ["BatchKey", "BatchReply", "BatchRun", "BatchRunner", "Batcher"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchKey:
    """What must be equal for two requests to share a batch (and a worker job)."""

    fanouts: tuple[int, ...] | None = None
    """Per-layer sampling fanouts; ``None`` = exact full-neighbour evaluation."""
    seed: int = 0
    """Sampling seed (0 for exact batches)."""

    @property
    def exact(self) -> bool:
        """Whether batches of this key are exact (no sampling)."""
        return self.fanouts is None


@dataclass
class BatchRun:
    """What the batch runner returns for one batch of unique, ascending targets."""

    rows: np.ndarray
    """float32 ``[len(targets), dim]``; row ``i`` belongs to ``targets[i]``."""
    timing: StageTimes = field(default_factory=StageTimes)
    """Seconds per stage of the batch (shared by every request in it)."""
    num_requests: int = 0
    """Requests that shared the batch (set by the batcher)."""
    graph_seq: int = 0
    """Graph sequence the rows were computed at."""


@dataclass
class BatchReply:
    """Result of :meth:`Batcher.submit`."""

    rows: np.ndarray
    """float32 ``[len(storage_ids), dim]``, in submission (ascending id) order."""
    queue_wait_s: float
    """From submission until the request's last part was dispatched."""
    runs: tuple[BatchRun, ...]
    """The batches the request rode in (one per part)."""

    @property
    def graph_seq(self) -> int:
        """The oldest graph sequence among the request's rows."""
        return min((run.graph_seq for run in self.runs), default=0)


BatchRunner = Callable[[np.ndarray, BatchKey, float], Awaitable[BatchRun]]
"""``runner(targets, key, deadline)``: compute rows of unique ascending storage ids.

``deadline`` is the latest deadline of the requests in the batch (``loop.time()`` clock).
"""


class Batcher:
    """Per-model dynamic batcher in front of a :data:`BatchRunner`.

    Args:
        model: Model name (metric label and error messages).
        runner: Computes one batch (plans, dispatches, collects stats).
        max_batch_targets: Most unique targets per batch (``server.max_batch_targets``).
        max_wait_s: How long the first request of a batch waits for company.
        max_queue: Most requests waiting (not yet dispatched) at once.
        max_inflight: Most batches running at once (e.g. the number of workers).
        max_batch_requests: Most requests (parts) per batch; 0 = no limit. ``1`` with
            ``max_wait_s=0`` turns coalescing off: every request is its own job.
        stall_after_s: How long work may wait or run without any batch finishing before
            :meth:`stalled` reports the model stalled.
        metrics: Where to record ``hopserve_batch_*``, queue depth and ``queue_wait``.
    """

    def __init__(
        self,
        model: str,
        runner: BatchRunner,
        *,
        max_batch_targets: int,
        max_wait_s: float,
        max_queue: int,
        max_inflight: int = 1,
        max_batch_requests: int = 0,
        stall_after_s: float = 10.0,
        metrics: Metrics | None = None,
    ) -> None:
        if max_batch_targets < 1 or max_queue < 1 or max_inflight < 1 or max_wait_s < 0:
            raise ValueError(
                "max_batch_targets, max_queue and max_inflight must be >= 1 and max_wait_s "
                f">= 0 (got {max_batch_targets}, {max_queue}, {max_inflight}, {max_wait_s})"
            )
        if not stall_after_s > 0:
            raise ValueError(f"stall_after_s must be > 0 (got {stall_after_s})")
        self.model = model
        self._runner = runner
        self.max_batch_targets = int(max_batch_targets)
        self.max_wait_s = float(max_wait_s)
        self.max_queue = int(max_queue)
        self.max_batch_requests = int(max_batch_requests) if max_batch_requests > 0 else None
        self.max_inflight = int(max_inflight)
        self.stall_after_s = float(stall_after_s)
        self._metrics = metrics
        self._groups: dict[BatchKey, PendingGroup] = {}
        self._depth = 0
        self._wakeup = asyncio.Event()
        # Batch tasks holding a slot: added when created, removed by their done-callback.
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._last_progress = 0.0  # loop.time() of the last finished batch (or idle -> busy)

    @property
    def depth(self) -> int:
        """Requests waiting for (some of) their targets to be dispatched."""
        return self._depth

    @property
    def running(self) -> int:
        """Batches holding an in-flight slot (dispatched and not yet done)."""
        return len(self._running)

    def stalled(self, now: float) -> bool:
        """Whether work waits or runs and no batch has finished for ``stall_after_s``.

        ``now`` is an instant of the event loop's clock (``loop.time()``).
        """
        busy = self._depth > 0 or bool(self._running)
        return busy and now - self._last_progress >= self.stall_after_s

    # ------------------------------------------------------------------------ submit

    async def submit(self, storage_ids: np.ndarray, key: BatchKey, deadline: float) -> BatchReply:
        """Rows of ``storage_ids`` (in their order, duplicates repeated), computed in a batch.

        Args:
            storage_ids: int storage ids of the model's graph, 1-D; unique ascending ids
                (what the edge sends) are used without another ``np.unique``.
            key: Batch key; only equal keys share a batch.
            deadline: Absolute instant on the event loop's clock (``loop.time()``).

        Raises:
            QueueFullError: ``max_queue`` requests are already waiting.
            DeadlineExceededError: the deadline passed before the rows were ready.
            ShuttingDownError: the batcher is closed.
            Exception: whatever the runner raised for the request's batch.
        """
        if self._closed:
            raise ShuttingDownError(f"model {self.model!r} is shutting down")
        if self._depth >= self.max_queue:
            raise QueueFullError(
                f"model {self.model!r}: batcher queue is full ({self.max_queue} requests "
                "waiting); retry with backoff"
            )
        ids = np.asarray(storage_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("storage_ids is empty")
        if ids.size < 2 or bool((ids[1:] > ids[:-1]).all()):
            uniq, back = ids, None
        else:
            uniq = np.unique(ids)
            back = np.searchsorted(uniq, ids)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= deadline:
            raise DeadlineExceededError(f"model {self.model!r}: deadline exceeded before queueing")
        self._ensure_loop()
        if self._depth == 0 and not self._running:  # idle until now: nothing is late yet
            self._last_progress = now
        request = PendingRequest(uniq, deadline, now)
        parts = [
            PendingPart(request, uniq[i : i + self.max_batch_targets], loop.create_future(), now)
            for i in range(0, len(uniq), self.max_batch_targets)
        ]
        request.parts_left = len(parts)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = PendingGroup(key)
        group.parts.extend(parts)
        group.targets += len(uniq)
        self._set_depth(self._depth + 1)
        self._wakeup.set()
        futures = [p.future for p in parts]
        try:
            done, pending = await asyncio.wait(
                futures, timeout=max(0.0, deadline - now), return_when=asyncio.FIRST_EXCEPTION
            )
            # Retrieve every failed part's error (asyncio logs one never retrieved), raise
            # the first: parts of a split request can fail in the same step.
            errors = [f.exception() for f in futures if f in done and not f.cancelled()]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
            if pending:
                raise DeadlineExceededError(
                    f"model {self.model!r}: deadline exceeded after "
                    f"{loop.time() - now:.3f}s waiting for {len(uniq)} node(s)"
                )
            results = [f.result() for f in futures]
        finally:
            self._leave(request, parts)
        return self._assemble(parts, results, request, back)

    def _assemble(
        self,
        parts: list[PendingPart],
        results: list[tuple[np.ndarray, BatchRun]],
        request: PendingRequest,
        back: np.ndarray | None,
    ) -> BatchReply:
        """The request's rows: its parts' in order (they tile its unique ids), gathered
        back to the submitted order when that was not unique ascending."""
        rows = results[0][0] if len(parts) == 1 else np.concatenate([r for r, _ in results])
        if back is not None:
            rows = rows[back]
        dispatched = (
            request.dispatched_at if request.dispatched_at is not None else request.enqueued
        )
        return BatchReply(
            rows=rows,
            queue_wait_s=dispatched - request.enqueued,
            runs=tuple(run for _, run in results),
        )

    def _leave(self, request: PendingRequest, parts: list[PendingPart]) -> None:
        """Drop whatever of ``request`` is still queued or running (deadline, cancel)."""
        if request.parts_left > 0:
            request.parts_left = 0
            self._set_depth(self._depth - 1)
        changed = False
        for part in parts:
            if part.live:
                part.future.cancel()
                changed = True
                batch = part.batch
                if (
                    batch is not None
                    and batch.task is not None
                    and not any(p.live for p in batch.parts)
                ):
                    logger.debug("model %r: nobody needs the running batch; cancelling", self.model)
                    batch.task.cancel()
        if changed:
            for group in self._groups.values():
                if any(not p.live for p in group.parts):
                    group.recount()
            self._wakeup.set()

    # ------------------------------------------------------------------------ loop

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"batcher-{self.model}"
            )

    def _next_group(self, now: float) -> tuple[PendingGroup | None, float | None]:
        """The group to dispatch now (earliest due), else when the next one becomes due."""
        for key in [k for k, g in self._groups.items() if not g.parts]:
            del self._groups[key]
        best: PendingGroup | None = None
        best_at = due = float("inf")
        for group in self._groups.values():
            at = group.due_at(self.max_wait_s, self.max_batch_targets, self.max_batch_requests)
            if at <= now and at < best_at:
                best, best_at = group, at
            elif at > now:
                due = min(due, at)
        return best, (None if due == float("inf") else due)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wakeup.clear()
            if len(self._running) >= self.max_inflight:  # a done-callback wakes us
                await self._wakeup.wait()
                continue
            group, due = self._next_group(loop.time())
            if group is None:
                timeout = None if due is None else max(0.0, due - loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                continue
            try:
                batch = self._take(group, loop.time())
            except Exception:  # a bug: fail the group rather than hang its requests
                logger.exception("model %r: cannot form a batch", self.model)
                for part in group.parts:
                    if part.live:
                        part.future.set_exception(RuntimeError("batching failed"))
                group.recount()
                continue
            if batch is not None:
                self._start(group.key, batch)

    def _start(self, key: BatchKey, batch: PendingBatch) -> None:
        """Create the batch's task; it holds a slot until its done-callback runs."""
        task = asyncio.get_running_loop().create_task(self._run(key, batch))
        batch.task = task
        self._running.add(task)
        task.add_done_callback(functools.partial(self._finished, batch))

    def _finished(self, batch: PendingBatch, task: asyncio.Task[None]) -> None:
        """Done-callback of a batch task (also of one cancelled before it started):
        return its slot and fail the parts it leaves unanswered."""
        self._running.discard(task)
        if not task.cancelled():
            self._last_progress = asyncio.get_running_loop().time()
            if task.exception() is not None:  # _run delivers runner errors itself: a bug
                logger.error("model %r: batch task failed", self.model, exc_info=task.exception())
        for part in batch.parts:
            if part.live:
                part.future.set_exception(ShuttingDownError("batch cancelled"))
        self._wakeup.set()

    def _take(self, group: PendingGroup, now: float) -> PendingBatch | None:
        """Pop the next batch from ``group``; expired parts fail, requests fully
        dispatched leave the queue (their ``queue_wait`` is recorded)."""
        taken, expired = group.take(now, self.max_batch_targets, self.max_batch_requests)
        for part in expired:
            part.future.set_exception(
                DeadlineExceededError(f"model {self.model!r}: deadline exceeded while queued")
            )
        if not taken:
            return None
        batch = PendingBatch(taken)
        for part in taken:
            part.batch = batch
            request = part.request
            request.parts_left -= 1
            if request.parts_left == 0:
                request.dispatched_at = now
                self._set_depth(self._depth - 1)
                if self._metrics is not None:
                    self._metrics.observe_stage(self.model, "queue_wait", now - request.enqueued)
        return batch

    async def _run(self, key: BatchKey, batch: PendingBatch) -> None:
        live = [p for p in batch.parts if p.live]
        if not live:
            return
        # One request alone: its ids are the targets; shared: their union, formed once.
        targets = (
            live[0].ids if len(live) == 1 else np.unique(np.concatenate([p.ids for p in live]))
        )
        deadline = max(p.request.deadline for p in live)
        num_requests = len({id(p.request) for p in live})
        if self._metrics is not None:
            self._metrics.batch_requests.labels(self.model).observe(num_requests)
            self._metrics.batch_targets.labels(self.model).observe(len(targets))
        try:
            run = await self._runner(targets, key, deadline)
            if len(run.rows) != len(targets):
                raise RuntimeError(
                    f"batch runner returned {len(run.rows)} rows for {len(targets)} targets"
                )
        except Exception as exc:  # delivered to every request of the batch
            for part in batch.parts:
                if part.live:
                    part.future.set_exception(exc)
            return
        run.num_requests = num_requests
        for part in batch.parts:
            if part.live:
                rows = (
                    run.rows
                    if part.ids is targets
                    else run.rows[np.searchsorted(targets, part.ids)]
                )
                part.future.set_result((rows, run))

    def _set_depth(self, depth: int) -> None:
        self._depth = depth
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.model).set(depth)

    # ------------------------------------------------------------------------ close

    async def close(self) -> None:
        """Fail queued requests with :class:`ShuttingDownError` and cancel running batches."""
        self._closed = True
        for group in self._groups.values():
            for part in group.parts:
                if part.live:
                    part.future.set_exception(ShuttingDownError(f"model {self.model!r} stopped"))
        self._groups.clear()
        tasks = [t for t in (self._loop_task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
