"""1-D partition: each rank owns a contiguous range of storage ids, balanced by work.

A layer's work for a destination row is about its in-edges (aggregation) plus the row
itself (the dense transforms), so rank ``r``'s range is cut where the running cost
:math:`c(v) = \\text{indptr}[v] + v` (in-edges plus rows before ``v``) crosses
:math:`r \\cdot (E + N) / P`. Contiguous ranges of the RCMK order keep most in-edges
inside a range (DEAL §2.2: a 1-D partition assigns a contiguous ID range to each
partition; no METIS, whose cost an inference pass cannot earn back). Every rank gets at
least one row, so every rank's layer outputs have a shape to exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Partition", "partition_by_edges"]


@dataclass(frozen=True)
class Partition:
    """Contiguous storage-id ranges, one per rank: rank ``r`` owns ``bounds[r]:bounds[r+1]``."""

    bounds: tuple[int, ...]
    """``world_size + 1`` ascending offsets, ``bounds[0] = 0``, ``bounds[-1] = N``."""

    @property
    def world_size(self) -> int:
        return len(self.bounds) - 1

    def range(self, rank: int) -> tuple[int, int]:
        """``(start, end)`` of ``rank``'s rows."""
        return self.bounds[rank], self.bounds[rank + 1]

    def owners(self, ids: np.ndarray) -> np.ndarray:
        """The rank owning each storage id."""
        return np.searchsorted(np.asarray(self.bounds[1:-1]), ids, side="right")


def partition_by_edges(indptr: np.ndarray, world_size: int) -> Partition:
    """Cut ``N`` rows into ``world_size`` contiguous ranges of about equal ``E + N`` cost.

    Args:
        indptr: the CSC offsets ``[N + 1]`` (in-edges of ``v`` at ``indptr[v]:indptr[v+1]``).
        world_size: number of ranks ``P``.

    Raises:
        ValueError: ``P < 1``, or fewer nodes than ranks (a rank would own no row).
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    n = int(indptr.size) - 1
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if n < world_size:
        raise ValueError(
            f"the graph has {n} nodes, fewer than the {world_size} ranks: every rank must "
            "own at least one node; run with fewer processes"
        )
    cost = indptr[:-1] + np.arange(n, dtype=np.int64)  # cost before row v
    total = int(indptr[-1]) + n
    goals = (np.arange(1, world_size, dtype=np.float64) * total) / world_size
    cuts = np.searchsorted(cost, goals, side="left").astype(np.int64)
    # At least one row per rank: cut r lies in [r + 1, n - (P - 1 - r)], kept ascending.
    bounds = [0]
    for r, cut in enumerate(cuts.tolist()):
        low = bounds[-1] + 1
        high = n - (world_size - 1 - r)
        bounds.append(min(max(cut, low), high))
    bounds.append(n)
    return Partition(tuple(int(b) for b in bounds))
