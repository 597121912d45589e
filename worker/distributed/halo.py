"""The halo: which rows of other ranks each rank reads, computed once per job.

A layer computing destination rows ``[a, b)`` reads its source-row inputs at every
in-neighbour of the range: the rows inside the range are local, the rest (the *halo*,
:math:`N_{in}([a, b)) \\setminus [a, b)`) are owned by other ranks. Exact all-node
evaluation reads the same in-edges at every layer, so one halo serves every layer and
every value read over source rows (DEAL §3.4's SPMM: machine 0 sends the non-zero
column ids once, the owners answer with those rows).

A rank computes its own halo from its CSC slice alone; who must *send* what is learned by
exchanging the halo ids (:meth:`~.exchange.Comm.exchange_ids`), so no rank reads another
rank's part of the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hopserve.worker.distributed.partition import Partition

__all__ = ["HaloPlan", "halo_ids"]


def halo_ids(indptr: np.ndarray, indices: np.ndarray, start: int, end: int) -> np.ndarray:
    """Ascending unique in-neighbours of rows ``start:end`` outside that range (int64)."""
    a, b = int(indptr[start]), int(indptr[end])
    src = np.unique(np.asarray(indices[a:b], dtype=np.int64))
    return src[(src < start) | (src >= end)]


@dataclass(frozen=True)
class HaloPlan:
    """One rank's side of every halo exchange (the same for every layer and value).

    Received rows arrive grouped by owner rank, ascending within each group, and ranks
    own ascending ranges: concatenated they are ``need`` in order.
    """

    rank: int
    start: int  # first storage id this rank owns
    end: int  # one past the last
    need: np.ndarray  # ascending storage ids of the halo (rows received)
    recv_counts: tuple[int, ...]  # rows received from each rank
    send_rows: np.ndarray  # local row positions (id - start) sent, grouped by receiver
    send_counts: tuple[int, ...]  # rows sent to each rank

    @property
    def rows(self) -> np.ndarray:
        """The storage ids of a value's table after an exchange: ascending, halo and own."""
        below = self.need[self.need < self.start]
        above = self.need[self.need >= self.end]
        own = np.arange(self.start, self.end, dtype=np.int64)
        return np.concatenate([below, own, above])

    @property
    def split(self) -> int:
        """Received rows before this rank's own (those with ids below ``start``)."""
        return int(np.searchsorted(self.need, self.start))


def recv_counts(partition: Partition, need: np.ndarray) -> tuple[int, ...]:
    """Rows of ``need`` (ascending ids) owned by each rank."""
    counts = np.bincount(partition.owners(need), minlength=partition.world_size)
    return tuple(int(c) for c in counts)
