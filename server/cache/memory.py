"""In-process LRU embedding cache (one per front-end process; lost on restart)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from hopserve.server.cache.base import CacheNamespace, CacheObserver, EmbeddingCache

__all__ = ["MemoryEmbeddingCache"]

_Key = tuple[CacheNamespace, int]  # value: (expires_at, row, graph seq)


class MemoryEmbeddingCache(EmbeddingCache):
    """A bounded LRU of embedding rows, safe across asyncio tasks and threads.

    A lookup hit and a store both make a row most recently used; storing beyond
    ``max_entries`` evicts the least recently used rows.

    Args:
        max_entries: Capacity in rows (>= 1).
        ttl_s: Optional expiry of each row in seconds (``None`` or 0: never expires).
        observer: Optional receiver of cache events.
        clock: Monotonic time source (injectable for tests).
    """

    name = "memory"

    def __init__(
        self,
        max_entries: int,
        *,
        ttl_s: float | None = None,
        observer: CacheObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(observer=observer)
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 (got {max_entries})")
        self.max_entries = max_entries
        self.ttl_s = ttl_s or None
        self.evictions = 0
        """Rows dropped to stay within ``max_entries`` (expired rows not included)."""
        self._clock = clock
        self._rows: OrderedDict[_Key, tuple[float, np.ndarray, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._record_available(True)  # in-process: always up

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"MemoryEmbeddingCache(max_entries={self.max_entries}, entries={len(self)})"

    async def _get(
        self, namespace: CacheNamespace, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mask = np.zeros(ids.size, dtype=bool)
        rows = np.zeros((ids.size, namespace.dim), dtype=np.float32)
        seqs = np.zeros(ids.size, dtype=np.int64)
        now = self._clock()
        with self._lock:
            for position, node in enumerate(ids.tolist()):
                key = (namespace, node)
                entry = self._rows.get(key)
                if entry is None:
                    continue
                expires_at, row, seq = entry
                if expires_at <= now:
                    del self._rows[key]
                    continue
                self._rows.move_to_end(key)
                rows[position] = row
                mask[position] = True
                seqs[position] = seq
        return mask, rows, seqs

    async def _put(
        self, namespace: CacheNamespace, ids: np.ndarray, array: np.ndarray, seq: int
    ) -> None:
        expires_at = self._clock() + self.ttl_s if self.ttl_s else float("inf")
        with self._lock:
            for position, node in enumerate(ids.tolist()):
                key = (namespace, node)
                row = array[position].astype(np.float32)  # own copy: never pin the batch
                row.flags.writeable = False
                self._rows[key] = (expires_at, row, seq)
                self._rows.move_to_end(key)
            overflow = len(self._rows) - self.max_entries
            for _ in range(max(overflow, 0)):
                self._rows.popitem(last=False)
            self.evictions += max(overflow, 0)

    async def close(self) -> None:
        """Drop every row."""
        with self._lock:
            self._rows.clear()
