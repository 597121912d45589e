"""The cache interface: :class:`EmbeddingCache`, its key namespace, stats and observer hook.

The cache never imports the metrics module. Whoever builds a cache may pass an object
implementing :class:`CacheObserver` (``hopserve.server.metrics.Metrics.cache_observer()``
does) to turn cache events into Prometheus series; the plain-int :class:`CacheStats` are
kept regardless.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Protocol

import numpy as np

from hopserve.server.cache.codec import as_node_ids, as_rows

__all__ = ["CacheNamespace", "CacheObserver", "CacheStats", "EmbeddingCache"]

_COMPONENT = re.compile(r"[^\s:]+")


@dataclass(frozen=True)
class CacheNamespace:
    """Everything that determines an embedding besides the node id.

    Each field is a component of the cache key, so changing any of them (new weights, new
    graph snapshot, different sampling) can never return an embedding computed under the
    old values. Components must be non-empty and contain no ``:`` or whitespace.
    """

    model: str
    """Model name."""
    model_version: str
    """Model version (bumped with new weights)."""
    graph_version: str
    """Version of the graph store the embeddings were computed on."""
    dim: int
    """Embedding width; a stored value must be exactly ``dim * 4`` bytes."""
    variant: str = "exact"
    """``"exact"`` for full-neighbour embeddings, else the sampling that produced them
    (see :meth:`variant_for`)."""

    def __post_init__(self) -> None:
        for field in ("model", "model_version", "graph_version", "variant"):
            value = getattr(self, field)
            if not isinstance(value, str) or not _COMPONENT.fullmatch(value):
                raise ValueError(
                    f"CacheNamespace.{field} must be a non-empty string without ':' or "
                    f"whitespace (got {value!r})"
                )
        if isinstance(self.dim, bool) or not isinstance(self.dim, int | np.integer) or self.dim < 1:
            raise ValueError(f"CacheNamespace.dim must be a positive int (got {self.dim!r})")

    @staticmethod
    def variant_for(fanouts: Sequence[int] | None, seed: int | None = None) -> str:
        """The ``variant`` string for a request: ``"exact"`` or e.g. ``"f10-5.s42"``.

        Args:
            fanouts: Neighbours sampled per layer (``None`` or empty = exact, all neighbours).
            seed: Sampling seed; results are only reusable for the same seed.
        """
        if not fanouts:
            return "exact"
        spec = "f" + "-".join(str(int(f)) for f in fanouts)
        return spec if seed is None else f"{spec}.s{int(seed)}"


@dataclass
class CacheStats:
    """Plain counters kept by every cache (hits and misses count node ids)."""

    hits: int = 0
    """Node ids found."""
    misses: int = 0
    """Node ids not found (including every id looked up while the backend is unavailable)."""
    errors: int = 0
    """Failed backend operations plus stored values rejected as corrupt."""
    rejected: int = 0
    """Stored values refused by the integrity check (also counted in ``errors``)."""
    stale: int = 0
    """Rows found but computed before a graph update that could change them (misses)."""


class CacheObserver(Protocol):
    """Receives cache events; implemented by the metrics module (duck-typed)."""

    def cache_lookup(self, backend: str, model: str, hits: int, misses: int) -> None:
        """``hits`` + ``misses`` node ids were looked up for ``model``."""

    def cache_error(self, backend: str, model: str, op: str, count: int) -> None:
        """``count`` errors in operation ``op`` (``get``, ``put`` or ``decode``)."""

    def cache_rejected(self, backend: str, model: str, reason: str, count: int) -> None:
        """``count`` stored values failed the integrity check for ``reason``."""

    def cache_operation(self, backend: str, op: str, seconds: float) -> None:
        """One backend round trip ``op`` (``get``, ``put``, ``ping``) took ``seconds``."""

    def cache_available(self, backend: str, up: bool) -> None:
        """The backend became reachable (``up``) or unreachable."""

    def cache_far_skipped(self, backend: str, model: str, count: int) -> None:
        """``count`` near-tier misses of ``model`` were not looked up in the shared
        ``backend`` (its recent hit rate was below ``cache.far_min_hit_rate``)."""


class EmbeddingCache(abc.ABC):
    """An asyncio cache of embedding rows keyed by (:class:`CacheNamespace`, node id).

    Contract: no method raises because the backend failed; a failed lookup is a miss and
    a failed store is dropped. Invalid arguments (shapes, dtypes) do raise ``ValueError``:
    :meth:`get_many` and :meth:`put_many` check them and keep the lookup stats here, once;
    a backend implements only :meth:`_get` and :meth:`_put`.

    Args:
        observer: Optional receiver of cache events (e.g. for Prometheus).
    """

    name: ClassVar[str]
    """Backend name used in logs and metric labels: ``"redis"``, ``"memory"`` or ``"none"``."""

    def __init__(self, *, observer: CacheObserver | None = None) -> None:
        self.stats = CacheStats()
        self._observer = observer

    async def get_many(
        self,
        namespace: CacheNamespace,
        node_ids: np.ndarray,
        min_seq: np.ndarray | None = None,
        max_seq: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Look up the rows of ``node_ids`` (int array, shape ``[N]``).

        Args:
            min_seq: Per id, the oldest graph sequence a row may have been computed at
                (a living graph's stale-since sequence); an older row is a miss
                (counted in ``stats.stale``). ``None``: any.
            max_seq: The graph's current sequence: a row claiming a later one belongs to
                another history and is a miss too.

        Returns:
            ``(hit_mask, rows)``: bool ``[N]`` and float32 ``[N, namespace.dim]``; rows of
            misses are zero.
        """
        mask, rows, _ = await self.lookup(namespace, node_ids, min_seq, max_seq)
        return mask, rows

    async def lookup(
        self,
        namespace: CacheNamespace,
        node_ids: np.ndarray,
        min_seq: np.ndarray | None = None,
        max_seq: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`get_many`, and the graph sequence each hit was computed at (int64
        ``[N]``, 0 for misses)."""
        ids = as_node_ids(node_ids)
        if ids.size == 0:
            empty = np.zeros((0, namespace.dim), dtype=np.float32)
            return np.zeros(0, dtype=bool), empty, np.zeros(0, dtype=np.int64)
        mask, rows, seqs = await self._get(namespace, ids)
        if min_seq is not None or max_seq is not None:
            low = np.int64(-1) if min_seq is None else np.asarray(min_seq, dtype=np.int64)
            stale = mask & (seqs < low)
            if max_seq is not None:
                stale |= mask & (seqs > max_seq)
            if stale.any():
                self.stats.stale += int(stale.sum())
                mask = mask & ~stale
                rows[stale] = 0
                seqs[stale] = 0
        hits = int(mask.sum())
        self._record_lookup(namespace, hits, ids.size - hits)
        return mask, rows, seqs

    async def put_many(
        self, namespace: CacheNamespace, node_ids: np.ndarray, rows: np.ndarray, seq: int = 0
    ) -> None:
        """Store ``rows`` (``[N, namespace.dim]``, cast to float32) under ``node_ids``,
        computed at graph sequence ``seq``."""
        ids = as_node_ids(node_ids)
        array = as_rows(rows, ids.size, namespace.dim)
        if ids.size:
            await self._put(namespace, ids, array, int(seq))

    @abc.abstractmethod
    async def _get(
        self, namespace: CacheNamespace, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(hit_mask, rows, seqs)`` of non-empty int64 ``ids`` (zero rows for misses and
        when the backend fails; ``seqs`` the graph sequence of each row); the caller
        records the lookup."""

    @abc.abstractmethod
    async def _put(
        self, namespace: CacheNamespace, ids: np.ndarray, rows: np.ndarray, seq: int
    ) -> None:
        """Store float32 ``rows`` (``[len(ids), dim]``) computed at graph sequence ``seq``
        under non-empty ``ids``; a backend failure drops them."""

    async def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release connections and background tasks; the cache is unusable afterwards."""

    @property
    def hits(self) -> int:
        """Node ids found so far."""
        return self.stats.hits

    @property
    def misses(self) -> int:
        """Node ids not found so far."""
        return self.stats.misses

    @property
    def errors(self) -> int:
        """Backend errors and corrupt values so far."""
        return self.stats.errors

    async def __aenter__(self) -> EmbeddingCache:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # Helpers for implementations: keep stats and observer in step.
    def _record_lookup(self, namespace: CacheNamespace, hits: int, misses: int) -> None:
        self.stats.hits += hits
        self.stats.misses += misses
        if self._observer is not None:
            self._observer.cache_lookup(self.name, namespace.model, hits, misses)

    def _record_error(self, namespace: CacheNamespace, op: str, count: int = 1) -> None:
        self.stats.errors += count
        if self._observer is not None:
            self._observer.cache_error(self.name, namespace.model, op, count)

    def _record_rejected(self, namespace: CacheNamespace, reasons: Mapping[str, int]) -> None:
        total = sum(reasons.values())
        self.stats.rejected += total
        self._record_error(namespace, "decode", total)
        if self._observer is not None:
            for reason, count in reasons.items():
                if count:
                    self._observer.cache_rejected(self.name, namespace.model, reason, count)

    def _record_operation(self, op: str, seconds: float) -> None:
        if self._observer is not None:
            self._observer.cache_operation(self.name, op, seconds)

    def _record_available(self, up: bool) -> None:
        if self._observer is not None:
            self._observer.cache_available(self.name, up)
