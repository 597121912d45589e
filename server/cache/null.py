"""The cache that caches nothing (``cache.backend: none``)."""

from __future__ import annotations

import numpy as np

from hopserve.server.cache.base import CacheNamespace, EmbeddingCache

__all__ = ["NullCache"]


class NullCache(EmbeddingCache):
    """Every lookup misses (and is counted as misses); every store is dropped."""

    name = "none"

    async def _get(
        self, namespace: CacheNamespace, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = ids.size
        return np.zeros(n, bool), np.zeros((n, namespace.dim), np.float32), np.zeros(n, np.int64)

    async def _put(
        self, namespace: CacheNamespace, ids: np.ndarray, rows: np.ndarray, seq: int
    ) -> None:
        """Stores nothing."""
