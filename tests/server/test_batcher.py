"""The dynamic batcher alone, driven by a recording fake runner (pure asyncio)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from hopserve.server.batcher import Batcher, BatchKey, BatchRun
from hopserve.server.errors import DeadlineExceededError, QueueFullError
from hopserve.server.metrics import Metrics
from hopserve.server.timing import StageTimes

DIM = 3
EXACT = BatchKey()


def rows_of(ids: np.ndarray) -> np.ndarray:
    """Row of storage id ``v`` is ``[v, v + 0.5, -v]``."""
    ids = np.asarray(ids, dtype=np.float32)
    return np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32)


class FakeRunner:
    """Records every batch; optionally blocks until released."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[np.ndarray, BatchKey]] = []
        self.delay = delay
        self.started = asyncio.Event()
        self.cancelled = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, targets: np.ndarray, key: BatchKey, deadline: float) -> BatchRun:
        assert targets.dtype == np.int64 and (np.diff(targets) > 0).all()
        self.calls.append((targets.copy(), key))
        self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return BatchRun(rows=rows_of(targets), timing=StageTimes(compute=0.001))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def make(runner: FakeRunner, **kw: Any) -> tuple[Batcher, Metrics]:
    metrics = Metrics(process_collectors=False)
    options = {"max_batch_targets": 100, "max_wait_s": 0.05, "max_queue": 16} | kw
    return Batcher("m", runner, metrics=metrics, **options), metrics


def run_with_batcher(
    main: Callable[[FakeRunner, Batcher, Metrics], Awaitable[None]], delay: float = 0.0, **kw: Any
) -> None:
    """``main(runner, batcher, metrics)`` on a fresh loop (:func:`run`) with a new
    :class:`FakeRunner` (``delay``) and ``make(runner, **kw)``."""

    async def run_main() -> None:
        runner = FakeRunner(delay)
        await main(runner, *make(runner, **kw))

    run(run_main())


def deadline(seconds: float = 5.0) -> float:
    return asyncio.get_running_loop().time() + seconds


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or {"model": "m"})
    return 0.0 if value is None else value


def test_concurrent_requests_coalesce_into_one_batch() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, metrics: Metrics) -> None:
        requests = [np.array([i, i + 10]) for i in range(5)]
        replies = await asyncio.gather(
            *(batcher.submit(ids, EXACT, deadline()) for ids in requests)
        )
        assert len(runner.calls) == 1
        for ids, reply in zip(requests, replies, strict=True):
            np.testing.assert_array_equal(reply.rows, rows_of(ids))
            assert reply.runs[0].num_requests == 5
        assert sample(metrics, "hopserve_batch_requests_sum") == 5
        assert sample(metrics, "hopserve_batch_requests_count") == 1
        assert sample(metrics, "hopserve_queue_depth") == 0
        await batcher.close()

    run_with_batcher(main)


def test_waits_max_wait_then_dispatches_a_lone_request() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, metrics: Metrics) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        reply = await batcher.submit(np.array([4]), EXACT, deadline())
        waited = loop.time() - t0
        assert 0.09 <= waited < 1.0
        assert reply.queue_wait_s >= 0.09
        labels = {"model": "m", "stage": "queue_wait"}
        assert sample(metrics, "hopserve_stage_duration_seconds_count", **labels) == 1
        await batcher.close()

    run_with_batcher(main, max_wait_s=0.1)


def test_shared_and_duplicate_targets_are_computed_once() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        a = np.array([7, 3, 7, 9, 3])  # duplicates inside one request, any order
        b = np.array([9, 1, 7])  # overlaps with a
        ra, rb = await asyncio.gather(
            batcher.submit(a, EXACT, deadline()), batcher.submit(b, EXACT, deadline())
        )
        assert len(runner.calls) == 1
        np.testing.assert_array_equal(runner.calls[0][0], [1, 3, 7, 9])
        np.testing.assert_array_equal(ra.rows, rows_of(a))
        np.testing.assert_array_equal(rb.rows, rows_of(b))
        await batcher.close()

    run_with_batcher(main)


def test_max_batch_targets_splits_batches_and_large_requests() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, metrics: Metrics) -> None:
        big = np.arange(10)[::-1]  # 10 unique targets > 4: split into parts 4 + 4 + 2
        small = np.array([100, 101, 102])
        rbig, rsmall = await asyncio.gather(
            batcher.submit(big, EXACT, deadline()), batcher.submit(small, EXACT, deadline())
        )
        np.testing.assert_array_equal(rbig.rows, rows_of(big))
        np.testing.assert_array_equal(rsmall.rows, rows_of(small))
        assert all(len(targets) <= 4 for targets, _ in runner.calls)
        computed = np.concatenate([t for t, _ in runner.calls])
        assert sorted(computed.tolist()) == sorted([*range(10), 100, 101, 102])
        assert len(rbig.runs) == 3
        assert sample(metrics, "hopserve_batch_targets_sum") == 13
        await batcher.close()

    run_with_batcher(main, max_batch_targets=4, max_wait_s=0.02)


def test_overlapping_requests_share_a_batch_when_their_union_fits() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        a, b = np.array([1, 2, 3]), np.array([4, 3, 2])  # 6 targets, union of 4
        ra, rb = await asyncio.gather(
            batcher.submit(a, EXACT, deadline()), batcher.submit(b, EXACT, deadline())
        )
        assert [t.tolist() for t, _ in runner.calls] == [[1, 2, 3, 4]]
        np.testing.assert_array_equal(rb.rows, rows_of(b))
        await batcher.close()

    run_with_batcher(main, max_batch_targets=4, max_wait_s=0.05)


def test_full_batch_does_not_wait_for_max_wait() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await batcher.submit(np.arange(4), EXACT, deadline(10))
        assert loop.time() - t0 < 1.0
        await batcher.close()

    run_with_batcher(main, max_batch_targets=4, max_wait_s=5.0)


def test_different_keys_never_merge() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        keys = [EXACT, BatchKey((2, 2), 0), BatchKey((2, 2), 1), BatchKey((2, 2), 0)]
        await asyncio.gather(*(batcher.submit(np.array([1, 2]), k, deadline()) for k in keys))
        assert sorted(str(k) for _, k in runner.calls) == sorted(str(k) for k in set(keys))
        assert len(runner.calls) == 3
        await batcher.close()

    run_with_batcher(main)


def test_queue_bound_raises_queue_full() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, metrics: Metrics) -> None:
        runner.gate = asyncio.Event()
        first = asyncio.create_task(batcher.submit(np.array([1]), EXACT, deadline()))
        await runner.started.wait()  # first is running (not waiting any more)
        waiting = [
            asyncio.create_task(batcher.submit(np.array([i]), EXACT, deadline())) for i in (2, 3)
        ]
        await asyncio.sleep(0.01)
        assert batcher.depth == 2
        assert sample(metrics, "hopserve_queue_depth") == 2
        with pytest.raises(QueueFullError, match="queue is full"):
            await batcher.submit(np.array([4]), EXACT, deadline())
        runner.gate.set()
        await asyncio.gather(first, *waiting)
        assert batcher.depth == 0
        await batcher.close()

    run_with_batcher(main, max_queue=2, max_wait_s=0.0)


def test_expired_request_is_dropped_and_its_batch_not_dispatched() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, metrics: Metrics) -> None:
        with pytest.raises(DeadlineExceededError, match="deadline exceeded"):
            await batcher.submit(np.array([1, 2]), EXACT, deadline(0.05))
        assert batcher.depth == 0
        await asyncio.sleep(0.4)  # past the batch's max_wait: nothing to run
        assert runner.calls == []
        assert sample(metrics, "hopserve_batch_requests_count") == 0
        await batcher.close()

    run_with_batcher(main, max_wait_s=0.3)


def test_expired_request_targets_leave_a_shared_batch() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        short = asyncio.create_task(batcher.submit(np.array([1, 2]), EXACT, deadline(0.05)))
        long = asyncio.create_task(batcher.submit(np.array([3]), EXACT, deadline(5)))
        with pytest.raises(DeadlineExceededError):
            await short
        reply = await long
        np.testing.assert_array_equal(reply.rows, rows_of([3]))
        np.testing.assert_array_equal(runner.calls[0][0], [3])  # 1 and 2 were dropped
        await batcher.close()

    run_with_batcher(main, max_wait_s=0.2)


def test_running_batch_is_cancelled_when_its_only_requester_leaves() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        runner.gate = asyncio.Event()  # never released: the job would run forever
        task = asyncio.create_task(batcher.submit(np.array([5]), EXACT, deadline()))
        await runner.started.wait()
        task.cancel()  # client cancellation
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        assert runner.cancelled == 1
        # the batcher is still usable afterwards
        runner.gate.set()
        reply = await batcher.submit(np.array([6]), EXACT, deadline())
        np.testing.assert_array_equal(reply.rows, rows_of([6]))
        await batcher.close()

    run_with_batcher(main, max_wait_s=0.0)


def test_running_batch_continues_while_another_requester_needs_it() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        runner.gate = asyncio.Event()
        a = asyncio.create_task(batcher.submit(np.array([1]), EXACT, deadline()))
        b = asyncio.create_task(batcher.submit(np.array([2]), EXACT, deadline()))
        await runner.started.wait()
        a.cancel()
        await asyncio.sleep(0.01)
        assert runner.cancelled == 0
        runner.gate.set()
        np.testing.assert_array_equal((await b).rows, rows_of([2]))
        await batcher.close()

    run_with_batcher(main, max_wait_s=0.05)


def test_runner_answering_the_wrong_rows_fails_the_requests() -> None:
    async def main() -> None:
        async def short(targets: np.ndarray, key: BatchKey, deadline: float) -> BatchRun:
            return BatchRun(rows=rows_of(targets[:-1]))

        batcher = Batcher("m", short, max_batch_targets=10, max_wait_s=0.0, max_queue=4)
        with pytest.raises(RuntimeError, match="1 rows for 2 targets"):
            await batcher.submit(np.array([1, 2]), EXACT, deadline())
        await batcher.close()

    run(main())


def test_runner_error_reaches_every_request_of_the_batch() -> None:
    async def main() -> None:
        async def failing(targets: np.ndarray, key: BatchKey, deadline: float) -> BatchRun:
            raise RuntimeError("boom")

        batcher = Batcher("m", failing, max_batch_targets=10, max_wait_s=0.02, max_queue=4)
        results = await asyncio.gather(
            batcher.submit(np.array([1]), EXACT, deadline()),
            batcher.submit(np.array([2]), EXACT, deadline()),
            return_exceptions=True,
        )
        assert [str(r) for r in results] == ["boom", "boom"]
        await batcher.close()

    run(main())


def test_every_failed_part_of_a_split_request_is_retrieved() -> None:
    """A request split over batches that fail together raises one error, and asyncio never
    logs "Future exception was never retrieved" for the others (found by the TLS fuzz run:
    parts expiring in the same step)."""
    unretrieved: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx["message"]))

        async def failing(targets: np.ndarray, key: BatchKey, deadline: float) -> BatchRun:
            raise RuntimeError(f"boom {targets.tolist()}")

        batcher = Batcher("m", failing, max_batch_targets=2, max_wait_s=0.0, max_queue=4,
                          max_inflight=3)  # fmt: skip
        try:
            await batcher.submit(np.array([1, 2, 3, 4, 5, 6]), EXACT, deadline())
        except RuntimeError as err:
            message = str(err)  # not the error itself: its traceback keeps the parts alive
        assert message == "boom [1, 2]"
        await batcher.close()

    run(main())
    gc.collect()  # an unretrieved exception is reported when its future is collected
    assert unretrieved == []


def test_max_batch_requests_one_turns_coalescing_off() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        requests = [np.array([i, i + 10]) for i in range(5)]
        replies = await asyncio.gather(
            *(batcher.submit(ids, EXACT, deadline()) for ids in requests)
        )
        assert len(runner.calls) == 5  # one job per request, none merged
        for ids, reply in zip(requests, replies, strict=True):
            np.testing.assert_array_equal(reply.rows, rows_of(ids))
        await batcher.close()

    run_with_batcher(main, delay=0.01, max_wait_s=0.0, max_batch_requests=1)


def test_cancellations_swept_across_the_wait_window_never_leak_a_slot() -> None:
    """Regression: a caller cancelled between its batch's dispatch and the batch task's
    first step cancelled the task before it ran, so its in-flight slot was never given
    back and every later request of the model hung until its deadline."""

    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        loop = asyncio.get_running_loop()
        steps = 300
        for i in range(steps):  # cancel at moments swept across the wait window and beyond
            task = loop.create_task(batcher.submit(np.array([i % 50]), EXACT, deadline()))
            await asyncio.sleep(0.015 * i / steps)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        later = [batcher.submit(np.array([i, i + 1]), EXACT, deadline(3.0)) for i in range(20)]
        replies = await asyncio.gather(*later, return_exceptions=True)
        answered = [r for r in replies if not isinstance(r, BaseException)]
        assert len(answered) == 20, [r for r in replies if isinstance(r, BaseException)][:3]
        assert not batcher.stalled(loop.time())

    run_with_batcher(main, delay=0.002, max_wait_s=0.01, max_inflight=1, max_queue=64)


def test_stalled_while_work_waits_and_no_batch_finishes() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        runner.gate = asyncio.Event()  # the worker hangs until the gate opens
        loop = asyncio.get_running_loop()
        assert not batcher.stalled(loop.time())  # idle is not stalled
        first = loop.create_task(batcher.submit(np.array([1]), EXACT, deadline()))
        await runner.started.wait()
        second = loop.create_task(batcher.submit(np.array([2]), EXACT, deadline()))
        await asyncio.sleep(0)
        assert not batcher.stalled(loop.time())
        await asyncio.sleep(0.25)
        assert batcher.running == 1 and batcher.depth == 1
        assert batcher.stalled(loop.time())
        runner.gate.set()  # the worker answers again
        await asyncio.gather(first, second)
        assert not batcher.stalled(loop.time())

    run_with_batcher(main, max_wait_s=0.0, max_inflight=1, stall_after_s=0.2)


def test_a_batch_cancelled_before_it_starts_fails_no_one_and_frees_its_slot() -> None:
    async def main(runner: FakeRunner, batcher: Batcher, _: Metrics) -> None:
        await batcher.submit(np.array([1]), EXACT, deadline())  # loop running
        await batcher.close()
        assert batcher.running == 0

    run_with_batcher(main, max_wait_s=0.0, max_inflight=1)
