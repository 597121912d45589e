"""A near tier in front of Redis: hot rows answered from the front-end's memory.

``cache.near_entries: N`` puts an in-process LRU of ``N`` rows
(:class:`~.memory.MemoryEmbeddingCache`) in front of the shared Redis cache::

    get_many:  near tier ──(valid rows)──▶ answer
                   │ the rest
                   ▼
               Redis (one MGET) ──(hits)──▶ answer, and copied into the near tier
    put_many:  near tier, then Redis

When Redis finds almost none of the near tier's misses (one front-end, say), only a
sample of them is looked up there until it does again (:class:`~.far_gate.FarTierGate`,
``cache.far_min_hit_rate``); the rest are misses, computed and written to both tiers.

Both tiers keep the graph sequence each row was computed at, and the same rule decides a
hit in both (a row older than its node's last possible change, or claiming a later
sequence, is a miss; :meth:`~.base.EmbeddingCache.get_many`), so the near tier is exactly
as fresh as Redis: a stale near row is never served and never hides a fresh Redis row.
Lookups and hits are counted per tier (``backend="memory"`` and ``"redis"``).
"""

from __future__ import annotations

import logging

import numpy as np

from hopserve.server.cache.base import CacheNamespace, CacheObserver, CacheStats, EmbeddingCache
from hopserve.server.cache.codec import as_node_ids
from hopserve.server.cache.far_gate import FarTierGate
from hopserve.server.cache.memory import MemoryEmbeddingCache

__all__ = ["TieredCache"]

logger = logging.getLogger(__name__)


class _TieredStats(CacheStats):
    """A tiered cache's :class:`CacheStats`: ``hits`` and ``misses`` are read from the near
    tier (every lookup starts there, so its counts are the cache's), never copied; the
    other counters are the tiered cache's own."""

    def __init__(self, near: EmbeddingCache) -> None:
        # Not the dataclass __init__: it would assign the two read-only counts.
        self._near = near
        self.errors = self.rejected = self.stale = 0

    @property
    def hits(self) -> int:
        return self._near.hits

    @property
    def misses(self) -> int:
        return self._near.misses


class TieredCache(EmbeddingCache):
    """``near`` (this process) in front of ``far`` (shared); see the module docstring.

    ``far_min_hit_rate``, ``far_window``, ``far_probe_every``: each model's
    :class:`~.far_gate.FarTierGate` (0: every near miss is looked up in ``far``).
    ``observer`` counts the misses not looked up (``cache_far_skipped``); each tier
    reports its own lookups.
    """

    def __init__(
        self,
        near: MemoryEmbeddingCache,
        far: EmbeddingCache,
        *,
        far_min_hit_rate: float = 0.01,
        far_window: int = 1024,
        far_probe_every: int = 16,
        observer: CacheObserver | None = None,
    ) -> None:
        super().__init__(observer=observer)
        self.near, self.far = near, far
        self.stats = _TieredStats(near)
        self.name = far.name  # the shared backend names the cache in logs and labels
        self._gate_args = (far_min_hit_rate, far_window, far_probe_every)
        self._gates: dict[str, FarTierGate] = {}
        self.far_skipped = 0  # near misses not looked up in ``far`` (gate closed)

    def gate(self, model: str) -> FarTierGate:
        """The far-tier gate of ``model``'s lookups."""
        gate = self._gates.get(model)
        if gate is None:
            rate, window, probe = self._gate_args
            gate = self._gates[model] = FarTierGate(rate, window, probe)
        return gate

    def __repr__(self) -> str:
        return f"TieredCache(near={self.near!r}, far={self.far!r})"

    def __getattr__(self, attr: str):  # noqa: ANN204 - the far tier's extras (label, url, …)
        if attr in ("near", "far"):  # not set yet
            raise AttributeError(attr)
        return getattr(self.far, attr)

    async def get_many(
        self,
        namespace: CacheNamespace,
        node_ids: np.ndarray,
        min_seq: np.ndarray | None = None,
        max_seq: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        ids = as_node_ids(node_ids)
        mask, rows = await self.near.get_many(namespace, ids, min_seq, max_seq)
        rest = ~mask
        if rest.any():
            gate = self.gate(namespace.model)
            if not gate.ask():
                skipped = int(rest.sum())
                self.far_skipped += skipped
                if self._observer is not None:
                    self._observer.cache_far_skipped(self.name, namespace.model, skipped)
                return mask, rows
            low = None if min_seq is None else np.asarray(min_seq, dtype=np.int64)[rest]
            far_ids = ids[rest]
            errors = self.far.errors
            far_mask, far_rows, far_seqs = await self.far.lookup(namespace, far_ids, low, max_seq)
            mask[rest], rows[rest] = far_mask, far_rows
            failed = self.far.errors != errors or not getattr(self.far, "available", True)
            changed = None if failed else gate.record(far_ids.size, int(far_mask.sum()))
            if changed is not None:
                if changed:
                    logger.info(
                        "cache: %s finds %r's near-tier misses again; looking each one up",
                        self.name,
                        namespace.model,
                    )
                else:
                    logger.info(
                        "cache: %s found under %.1f%% of %r's near-tier misses; asking it "
                        "on 1 lookup in %d until it finds more",
                        self.name,
                        100 * gate.min_hit_rate,
                        namespace.model,
                        gate.probe_every,
                    )
            if far_mask.any():  # promote: the next lookup of these stays in-process
                for seq in np.unique(far_seqs[far_mask]).tolist():
                    take = far_mask & (far_seqs == seq)
                    await self.near.put_many(namespace, far_ids[take], far_rows[take], seq)
        return mask, rows

    async def put_many(
        self, namespace: CacheNamespace, node_ids: np.ndarray, rows: np.ndarray, seq: int = 0
    ) -> None:
        await self.near.put_many(namespace, node_ids, rows, seq)
        await self.far.put_many(namespace, node_ids, rows, seq)

    async def _get(self, namespace, ids):  # noqa: ANN001, ANN202 - get_many is overridden
        raise NotImplementedError

    async def _put(self, namespace, ids, rows, seq):  # noqa: ANN001, ANN202 - likewise
        raise NotImplementedError

    async def close(self) -> None:
        await self.near.close()
        await self.far.close()
