"""Per-client rate limits: one token bucket per client key.

A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second; each RPC
takes one. An empty bucket answers with the seconds until the next token (the retry hint
sent to the client as ``retry-after-ms`` trailing metadata, which the SDK's backoff
honours). Keys are the authenticated client's name, or the peer's address when the port
takes no tokens. The number of buckets is bounded (least recently used ones are dropped,
which at worst refills a client early), so a flood of new peers cannot grow memory.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

__all__ = ["MAX_BUCKETS", "RateLimiter"]

MAX_BUCKETS = 65_536
"""Most clients tracked at once."""


class RateLimiter:
    """Token buckets keyed by client.

    Args:
        rate: default tokens per second (> 0).
        burst: bucket size; default ``max(1, ceil(rate))`` (one second's worth).
        clock: monotonic clock (tests pass a fake one).
    """

    def __init__(self, rate: float, burst: int | None = None, *, clock=time.monotonic) -> None:  # noqa: ANN001
        if not rate > 0:
            raise ValueError(f"rate must be > 0 requests per second, got {rate}")
        self.rate = float(rate)
        self.burst = int(burst) if burst is not None else max(1, math.ceil(rate))
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, t)
        self._lock = threading.Lock()

    def acquire(self, key: str, rate: float | None = None) -> float:
        """Take one token from ``key``'s bucket: 0.0 if granted, else seconds to wait.

        ``rate`` overrides the default rate for this client (its burst scales with it).
        """
        rate = self.rate if rate is None else rate
        burst = (
            self.burst if rate == self.rate else max(1, math.ceil(rate * self.burst / self.rate))
        )
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.pop(key, (float(burst), now))
            tokens = min(float(burst), tokens + (now - last) * rate)
            if tokens >= 1.0 - 1e-9:  # float rounding of (now - last) * rate
                tokens = max(0.0, tokens - 1.0)
                wait = 0.0
            else:
                wait = (1.0 - tokens) / rate
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        return wait
