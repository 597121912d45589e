"""When the shared tier is worth a round trip: a gate on the near tier's misses.

Behind a near tier (:mod:`~.tiered`) the shared Redis tier answers only what other
front-ends (or this one, before an eviction) wrote. With one front-end, or models whose
rows no other front-end computes, it finds nothing, and each lookup still costs a round
trip and Redis' CPU before the request can join a batch: on a 2-core box that took 38% of
the serving throughput for no hit (``bench/results/serve.md``).

The gate keeps the shared tier's hit rate over the keys it was last asked for (a tumbling
window of ``window`` keys). At ``min_hit_rate`` or more every near miss is looked up
there (*open*). Below it, only every ``probe_every``-th lookup with misses asks (*closed*),
and those probes' hit rate reopens it: a replica that starts writing shared rows is
noticed within a window of probes. A skipped lookup is a miss: its rows are computed,
exact as always, and written to both tiers. ``min_hit_rate`` 0: always open (no rate is
below it). A lookup that failed (Redis down: every key a miss) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FarTierGate"]


@dataclass
class FarTierGate:
    """Open/closed state and the counts of one model's far-tier lookups."""

    min_hit_rate: float = 0.01
    window: int = 1024
    probe_every: int = 16
    open: bool = True
    _asked: int = 0
    _hits: int = 0
    _closed_calls: int = 0

    def ask(self) -> bool:
        """Whether this lookup's near misses go to the far tier."""
        if self.open:
            return True
        self._closed_calls += 1
        return self._closed_calls % self.probe_every == 0

    def record(self, asked: int, hits: int) -> bool | None:
        """Count a far lookup of ``asked`` keys with ``hits`` found; the new state
        (``True`` open) when this window changed it, else ``None``."""
        self._asked += asked
        self._hits += hits
        if self._asked < self.window:
            return None
        rate = self._hits / self._asked
        self._asked = self._hits = 0
        was, self.open = self.open, rate >= self.min_hit_rate
        if self.open == was:
            return None
        self._closed_calls = 0
        return self.open
