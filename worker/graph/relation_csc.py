"""Each relation's in-edges as a CSC of its own, so a run of destinations reads one
relation's in-edges as one slice.

A typed store holds one CSC with a relation id per edge (:mod:`.relations`). A layer that
runs one conv per relation (``HeteroGraphConv``, ``HeteroConv``, ``to_hetero``) needs, per
batch and relation ``r``, the batch's ``r``-edges grouped by destination; from the shared
CSC that is a scan of the batch's relation ids and a gather of the matches, per relation
and batch. :class:`RelationCSC` keeps relation ``r``'s edges once, in the store's CSC order
(so within a destination in the store's order, and the same sums in the same order):

* the offsets of its destinations ``lo_r .. hi_r - 1`` (the first and one past the last
  with an ``r``-edge): all of them (``indptr[r]`` ``[hi_r - lo_r + 1]``, ``dst[r]`` ``None``)
  when that span is at most the relation's edge count, else only those with an ``r``-edge
  (``dst[r]``, ascending, and ``indptr[r]`` ``[len(dst[r]) + 1]``), so a sparse relation
  into a large type (or a type a live graph appended runs to) costs its edges, not the
  span; int32 below ``2**31`` edges;
* ``src[r]``: their sources (storage ids, the store's index dtype), in the store's CSC
  order;
* ``source_types[r]``: the node types of those sources (typed stores), so a layer that
  reads relation ``(s, r, t)`` knows once per graph that every source is of type ``s``.

Memory: the store's index once more (``E`` entries) and at most two more entries per edge.
Built on the first full layer that reads it, once per graph version
(:attr:`~.store.GraphStore.relation_csc`), in two passes over runs of about a million
edges, so the transient memory is a run's. Read-only: :meth:`RelationCSC.in_edges` hands
out views.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["RelationCSC"]


@dataclass(frozen=True, eq=False)
class RelationCSC:
    """Per relation: its first destination, CSC offsets, sources and their node types
    (see the module doc)."""

    lo: tuple[int, ...]
    indptr: tuple[Tensor, ...]
    dst: tuple[Tensor | None, ...]
    src: tuple[Tensor, ...]
    source_types: tuple[frozenset[int], ...] | None = None

    @classmethod
    def build(
        cls,
        indptr: np.ndarray,
        indices: np.ndarray,
        edge_type: np.ndarray,
        num_relations: int,
        type_of: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> RelationCSC:
        """From a CSC (``indptr`` ``[N + 1]``, ``indices`` ``[E]``) and its relation id per
        edge (``edge_type`` ``[E]``, ids below ``num_relations``); ``type_of`` (storage ids
        -> node type indices) records each relation's source types."""
        indptr = np.asarray(indptr, dtype=np.int64)
        chunks = _destination_chunks(indptr)
        lo = np.full(num_relations, indptr.size, dtype=np.int64)
        hi = np.zeros(num_relations, dtype=np.int64)
        size = np.zeros(num_relations, dtype=np.int64)
        for v0, v1, dst in _chunk_edges(indptr, chunks):  # pass 1: sizes and ends
            kinds = edge_type[indptr[v0] : indptr[v1]]
            for r in np.flatnonzero(np.bincount(kinds)).tolist():
                at = np.flatnonzero(kinds == r)
                lo[r] = min(lo[r], int(dst[at[0]]))
                hi[r] = max(hi[r], int(dst[at[-1]]) + 1)
                size[r] += at.size
        lo = np.where(size > 0, lo, 0)
        ptrs = [
            np.zeros(int(h - a) + 1, _offset_dtype(int(e)))
            for a, h, e in zip(lo, hi, size, strict=True)
        ]
        srcs = [np.empty(int(e), dtype=indices.dtype) for e in size]
        filled = np.zeros(num_relations, dtype=np.int64)
        for v0, v1, dst in _chunk_edges(indptr, chunks):  # pass 2: counts and sources
            a = indptr[v0]
            kinds = edge_type[a : indptr[v1]]
            for r in np.flatnonzero(np.bincount(kinds)).tolist():
                at = np.flatnonzero(kinds == r)
                b0, b1 = max(v0, lo[r]), min(v1, hi[r])  # the chunk's r-destinations
                counts = np.bincount(dst[at] - b0, minlength=b1 - b0)
                ptrs[r][b0 - lo[r] + 1 : b1 - lo[r] + 1] = counts
                srcs[r][filled[r] : filled[r] + at.size] = indices[a + at]
                filled[r] += at.size
        types, dsts = [], []
        for r in range(num_relations):
            counts = ptrs[r][1:]
            if counts.size > size[r]:  # sparse: keep the destinations that have edges
                present = np.flatnonzero(counts)
                node = np.int32 if indptr.size <= 2**31 else np.int64
                dsts.append(torch.from_numpy((present + lo[r]).astype(node)))
                ptrs[r] = np.concatenate([[0], counts[present]]).astype(counts.dtype)
            else:
                dsts.append(None)
            np.cumsum(ptrs[r], out=ptrs[r])
            if type_of is not None:
                present = np.flatnonzero(np.bincount(type_of(srcs[r])))
                types.append(frozenset(present.tolist()))
        ptrs = [torch.from_numpy(p) for p in ptrs]
        srcs = [torch.from_numpy(x) for x in srcs]
        kinds = tuple(types) if type_of is not None else None
        return cls(tuple(lo.tolist()), tuple(ptrs), tuple(dsts), tuple(srcs), kinds)

    @property
    def nbytes(self) -> int:
        """Bytes the offsets, destinations and sources take."""
        parts = (*self.indptr, *self.src, *(d for d in self.dst if d is not None))
        return sum(t.numel() * t.element_size() for t in parts)

    @property
    def num_relations(self) -> int:
        return len(self.lo)

    def in_edges(self, relation: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        """``(indptr, src)`` of relation ``relation``'s in-edges of destinations
        ``start .. end - 1``: a local CSC (int64 ``[end - start + 1]``, from 0) and the
        sources (a view of :attr:`src`, the store's index dtype: read-only)."""
        lo, ptr, dst = self.lo[relation], self.indptr[relation], self.dst[relation]
        if dst is not None:  # sparse: the window of destinations that have edges
            i0, i1 = torch.searchsorted(dst, torch.tensor([start, end], dtype=dst.dtype)).tolist()
            local = torch.zeros(end - start + 1, dtype=torch.long)
            local[(dst[i0:i1] - start + 1).long()] = (
                ptr[i0 + 1 : i1 + 1].diff(prepend=ptr[i0 : i0 + 1]).long()
            )
            first = int(ptr[i0])
            return local.cumsum_(0), self.src[relation][first : int(ptr[i1])]
        hi = lo + ptr.numel() - 1
        m0, m1 = min(max(start, lo), hi), min(max(end, lo), hi)
        local = ptr[m0 - lo : m1 - lo + 1].long()
        below, above = max(0, min(end, lo) - start), max(0, end - max(start, hi))
        if below or above:  # destinations outside lo .. hi - 1 have no r-edges
            local = torch.cat([local[:1].expand(below), local, local[-1:].expand(above)])
        first = int(local[0])
        return local - first, self.src[relation][first : int(local[-1])]


_CHUNK_EDGES = 1 << 20


def _offset_dtype(num_edges: int) -> np.dtype:
    """int32 offsets for a relation of fewer than ``2**31`` edges, else int64."""
    return np.dtype(np.int32 if num_edges < 2**31 else np.int64)


def _destination_chunks(indptr: np.ndarray) -> np.ndarray:
    """Destination bounds ``[0, ..., N]`` of runs of about :data:`_CHUNK_EDGES` in-edges
    (the build's transient memory is a chunk's, not the graph's)."""
    n, e = indptr.size - 1, int(indptr[-1])
    marks = np.searchsorted(indptr, np.arange(_CHUNK_EDGES, e, _CHUNK_EDGES), side="right")
    return np.unique(np.concatenate([[0], np.minimum(marks, n), [n]]))


def _chunk_edges(indptr: np.ndarray, chunks: np.ndarray):
    """``(v0, v1, dst)`` per chunk: its destinations and each of its in-edges'
    destination."""
    for v0, v1 in zip(chunks[:-1].tolist(), chunks[1:].tolist(), strict=True):
        counts = np.diff(indptr[v0 : v1 + 1])
        yield v0, v1, np.repeat(np.arange(v0, v1, dtype=np.int64), counts)
