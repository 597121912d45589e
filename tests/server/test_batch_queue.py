"""Batch formation policy of :class:`PendingGroup`, without an event loop running."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from hopserve.server.batch_queue import PendingGroup, PendingPart, PendingRequest
from hopserve.server.batcher import BatchKey


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _group(loop, *id_lists, deadline=10.0, arrival=0.0):
    group = PendingGroup(BatchKey())
    for ids in id_lists:
        ids = np.asarray(ids, dtype=np.int64)
        request = PendingRequest(ids, deadline, arrival, parts_left=1)
        group.parts.append(PendingPart(request, ids, loop.create_future(), arrival))
        group.targets += len(ids)
    return group


def test_take_counts_the_union_not_the_sum(loop) -> None:
    # 3 + 3 ids with 2 shared: a union of 4 fits a 4-target batch; the sum (6) would not.
    group = _group(loop, [1, 2, 3], [2, 3, 4], [9])
    taken, expired = group.take(now=0.0, max_targets=4, max_requests=None)
    assert [p.ids.tolist() for p in taken] == [[1, 2, 3], [2, 3, 4]]
    assert expired == []
    assert [p.ids.tolist() for p in group.parts] == [[9]] and group.targets == 1


def test_take_stops_at_the_first_part_that_does_not_fit(loop) -> None:
    group = _group(loop, [1, 2], [3, 4, 5], [6])
    taken, _ = group.take(now=0.0, max_targets=4, max_requests=None)
    assert [p.ids.tolist() for p in taken] == [[1, 2]]  # FIFO: [6] does not jump the queue


def test_take_respects_max_requests(loop) -> None:
    group = _group(loop, [1], [2], [3])
    taken, _ = group.take(now=0.0, max_targets=100, max_requests=2)
    assert len(taken) == 2 and len(group.parts) == 1


def test_take_hands_back_expired_and_skips_abandoned_parts(loop) -> None:
    group = _group(loop, [1], [2], deadline=5.0)
    group.parts[1].future.cancel()  # its caller went away
    group.parts.extend(_group(loop, [3], deadline=50.0).parts)
    taken, expired = group.take(now=6.0, max_targets=100, max_requests=None)
    assert [p.ids.tolist() for p in expired] == [[1]]
    assert [p.ids.tolist() for p in taken] == [[3]]
    assert not group.parts


def test_due_at_waits_unless_full(loop) -> None:
    group = _group(loop, [1, 2], arrival=1.0)
    assert group.due_at(max_wait_s=0.5, max_targets=4, max_requests=None) == 1.5
    assert group.due_at(max_wait_s=0.5, max_targets=2, max_requests=None) == 1.0
    assert group.due_at(max_wait_s=0.5, max_targets=4, max_requests=1) == 1.0
