"""The waiting side of the batcher: queued requests, their parts, and batch formation.

A request's unique targets are cut into parts of at most ``max_batch_targets``; parts
wait in the :class:`PendingGroup` of their batch key, in arrival order. Formation policy
(:meth:`PendingGroup.take`): the oldest live parts whose union has at most
``max_batch_targets`` targets (and, optionally, at most ``max_batch_requests`` parts);
expired parts are handed back to be failed. A group is due ``max_wait_s`` after its
oldest part arrived, or at once when it is full (:meth:`PendingGroup.due_at`).

Nothing here awaits: the batcher (:mod:`hopserve.server.batcher`) owns the loop, the
slots and the futures' outcomes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hopserve.server.batcher import BatchKey, BatchRun

__all__ = ["PendingBatch", "PendingGroup", "PendingPart", "PendingRequest"]


@dataclass(eq=False)
class PendingRequest:
    """One submitted request while any of its parts waits or runs."""

    uniq: np.ndarray  # unique ascending storage ids
    deadline: float
    enqueued: float
    parts_left: int = 0  # parts not dispatched yet
    dispatched_at: float | None = None


@dataclass(eq=False)
class PendingPart:
    """A contiguous slice of a request's ids, batched on its own."""

    request: PendingRequest
    ids: np.ndarray
    future: asyncio.Future[tuple[np.ndarray, BatchRun]]
    arrival: float
    batch: PendingBatch | None = None

    @property
    def live(self) -> bool:
        """Whether someone still waits for this part's rows."""
        return not self.future.done()


@dataclass(eq=False)
class PendingBatch:
    """Parts taken together into one job; ``task`` runs it."""

    parts: list[PendingPart]
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class PendingGroup:
    """Parts waiting under one batch key, oldest first."""

    key: BatchKey
    parts: deque[PendingPart] = field(default_factory=deque)
    # Targets over the pending parts, counted with multiplicity: an upper bound of their
    # union, cheap to keep. A group is full when it reaches max_batch_targets; overlap
    # only makes it dispatch a little earlier (taking everything pending that fits).
    targets: int = 0

    def recount(self) -> None:
        """Forget parts nobody waits for and recount the targets."""
        self.parts = deque(p for p in self.parts if p.live)
        self.targets = sum(len(p.ids) for p in self.parts)

    def due_at(self, max_wait_s: float, max_targets: int, max_requests: int | None) -> float:
        """When the group should be dispatched (an instant of the loop's clock)."""
        full = self.targets >= max_targets or (
            max_requests is not None and len(self.parts) >= max_requests
        )
        first = self.parts[0].arrival
        return first if full else first + max_wait_s

    def take(
        self, now: float, max_targets: int, max_requests: int | None
    ) -> tuple[list[PendingPart], list[PendingPart]]:
        """Pop the parts of the next batch: ``(taken, expired)``, both in FIFO order.

        The union is only computed exactly once the count with multiplicity could pass
        ``max_targets``, so small batches cost no set operations.
        """
        taken: list[PendingPart] = []
        expired: list[PendingPart] = []
        bound = 0  # >= the union size of the taken parts
        union: np.ndarray | None = None  # their exact union, when computed and current
        while self.parts:
            part = self.parts[0]
            if not part.live:
                self.parts.popleft()
                continue
            if part.request.deadline <= now:
                expired.append(self.parts.popleft())
                continue
            if max_requests is not None and len(taken) >= max_requests:
                break
            if taken and bound + len(part.ids) > max_targets:
                if union is None:
                    union = np.unique(np.concatenate([p.ids for p in taken]))
                merged = np.union1d(union, part.ids)
                if merged.size > max_targets:
                    break
                union, bound = merged, merged.size
            else:
                union, bound = None, bound + len(part.ids)
            self.parts.popleft()
            taken.append(part)
        self.recount()
        return taken, expired
