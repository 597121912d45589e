"""Deterministic synthetic graphs for demos, tests and benchmarks (vectorized, chunked).

- :func:`synth_powerlaw`: R-MAT edges with ``(a, b, c, d) = (0.57, 0.19, 0.19, 0.05)`` at
  scale ``ceil(log2 N)``; endpoints ``>= N`` are rejected (and regenerated), then nodes are
  randomly relabeled so degree does not correlate with ID. Heavy-tailed in/out degrees.
- :func:`synth_sbm`: stochastic block model with balanced random blocks; each edge picks a
  uniform destination and, with probability ``intra_fraction``, a source in the same block,
  else a uniform source from another block. Labels are the blocks.

``avg_degree`` is the target average in-degree ``E / N`` of the stored graph before dedup
(with ``symmetrize`` half as many edges are generated, then mirrored). Features are
Gaussian noise, plus a per-class centroid when there are classes (centroids are random
directions of norm ``separation / sqrt(2)``, so classes are ~``separation`` apart against
unit noise per dimension); they are generated directly in storage order in blocks seeded
by ``(seed, block)``, so every array is a pure function of the arguments. Edges are
generated in fixed-size chunks (bounded memory). ``node_ids`` of a reordered store are the
generator's node numbers.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from hopserve.worker.graph.atomic import check_target
from hopserve.worker.graph.build import CSC, build_csc
from hopserve.worker.graph.contents import contents_from_csc, materialize, write_contents
from hopserve.worker.graph.progress import progress_bar

if TYPE_CHECKING:
    from hopserve.worker.graph.store import GraphStore

__all__ = [
    "RMAT_PROBS",
    "GaussianFeatures",
    "rmat_edges",
    "sbm_edges",
    "synth_powerlaw",
    "synth_sbm",
]

log = logging.getLogger(__name__)

RMAT_PROBS = (0.57, 0.19, 0.19, 0.05)
_EDGE_CHUNK = 1 << 21  # edges generated per step (fixed: part of the determinism contract)
_FEATURE_BLOCK = 4096  # feature rows per independently seeded block
_STREAM_EDGES, _STREAM_NODES, _STREAM_FEATURES, _STREAM_CENTROIDS = 1, 2, 3, 4


def _rng(seed: int, stream: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), stream, *extra])


def rmat_edges(
    num_nodes: int,
    num_edges: int,
    *,
    seed: int = 0,
    probs: tuple[float, float, float, float] = RMAT_PROBS,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """R-MAT edge list over ``num_nodes`` nodes (any N >= 1), randomly relabeled.

    Returns:
        ``(src, dst)`` int64 arrays of length ``num_edges`` (self-loops and duplicates kept).
    """
    n, m = int(num_nodes), int(num_edges)
    if n < 1 or m < 0:
        raise ValueError(f"need num_nodes >= 1 and num_edges >= 0, got {n}, {m}")
    if not math.isclose(sum(probs), 1.0, abs_tol=1e-6) or min(probs) < 0:
        raise ValueError(f"probs must be >= 0 and sum to 1, got {probs}")
    rng = _rng(seed, _STREAM_EDGES)
    relabel = rng.permutation(n)
    scale = max(1, math.ceil(math.log2(n)))
    t1, t2, t3 = (np.float32(x) for x in np.cumsum(probs)[:3])
    src = np.empty(m, dtype=np.int64)
    dst = np.empty(m, dtype=np.int64)
    filled = 0
    with progress_bar(
        total=m, desc="R-MAT edges", unit="edge", enabled=progress, unit_scale=True
    ) as bar:
        while filled < m:
            s = np.zeros(_EDGE_CHUNK, dtype=np.int64)
            d = np.zeros(_EDGE_CHUNK, dtype=np.int64)
            for _ in range(scale):
                r = rng.random(_EDGE_CHUNK, dtype=np.float32)
                q = np.add(r >= t1, r >= t2, dtype=np.int8)
                q += r >= t3  # quadrant 0..3 = a, b, c, d
                s <<= 1
                s |= q >> 1
                d <<= 1
                d |= q & 1
            keep = np.flatnonzero((s < n) & (d < n))[: m - filled]
            k = keep.size
            src[filled : filled + k] = relabel[s[keep]]
            dst[filled : filled + k] = relabel[d[keep]]
            filled += k
            bar.update(k)
    return src, dst


def sbm_edges(
    blocks: np.ndarray, num_edges: int, *, intra_fraction: float = 0.8, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Stochastic-block-model edges given each node's block.

    Each edge gets a uniform destination; its source is uniform within the destination's
    block with probability ``intra_fraction``, else uniform over nodes of other blocks.
    """
    if not 0.0 <= intra_fraction <= 1.0:
        raise ValueError(f"intra_fraction must be in [0, 1], got {intra_fraction}")
    n, m = blocks.size, int(num_edges)
    rng = _rng(seed, _STREAM_EDGES)
    order = np.argsort(blocks, kind="stable")  # nodes grouped by block
    sizes = np.bincount(blocks)
    starts = np.cumsum(sizes) - sizes
    src = np.empty(m, dtype=np.int64)
    dst = np.empty(m, dtype=np.int64)
    for lo in range(0, m, _EDGE_CHUNK):
        k = min(_EDGE_CHUNK, m - lo)
        d = rng.integers(0, n, k)
        b = blocks[d]
        size_b, start_b = sizes[b], starts[b]
        other = n - size_b
        intra = (rng.random(k) < intra_fraction) | (other == 0)
        u = rng.random(k)
        pos_in = start_b + (u * size_b).astype(np.int64)
        pos_out = (u * other).astype(np.int64)
        pos_out += np.where(pos_out >= start_b, size_b, 0)  # skip over the own block
        src[lo : lo + k] = order[np.where(intra, pos_in, pos_out)]
        dst[lo : lo + k] = d
    return src, dst


class GaussianFeatures:
    """A feature source generating rows in storage order: noise (+ class centroid).

    Row ``i`` depends only on ``(seed, i // 4096)``, ``labels[i]`` and the centroids, so
    any chunking of reads gives the same values.
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        seed: int,
        dtype: str = "float32",
        labels: np.ndarray | None = None,
        centroids: np.ndarray | None = None,
    ) -> None:
        self._n, self._dim, self._dtype = int(num_rows), int(dim), np.dtype(dtype)
        self._seed, self._labels, self._centroids = int(seed), labels, centroids

    @property
    def num_rows(self) -> int:
        return self._n

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def read(self, rows: slice | np.ndarray) -> np.ndarray:
        if not isinstance(rows, slice):
            raise TypeError("GaussianFeatures reads contiguous storage rows only")
        start, stop, _ = rows.indices(self._n)
        out = np.empty((max(0, stop - start), self._dim), dtype=np.float32)
        for block in range(start // _FEATURE_BLOCK, -(-stop // _FEATURE_BLOCK)):
            b0 = block * _FEATURE_BLOCK
            b1 = min(self._n, b0 + _FEATURE_BLOCK)
            noise = _rng(self._seed, _STREAM_FEATURES, block).standard_normal(
                (b1 - b0, self._dim), dtype=np.float32
            )
            lo, hi = max(start, b0), min(stop, b1)
            out[lo - start : hi - start] = noise[lo - b0 : hi - b0]
        if self._labels is not None and self._centroids is not None:
            lab = self._labels[start:stop]
            has = lab >= 0
            out[has] += self._centroids[lab[has]]
        return out.astype(self._dtype, copy=False)


def _centroids(seed: int, num_classes: int, dim: int, separation: float) -> np.ndarray:
    c = _rng(seed, _STREAM_CENTROIDS).standard_normal((num_classes, dim))
    norms = np.linalg.norm(c, axis=1, keepdims=True)
    c *= (separation / math.sqrt(2.0)) / np.maximum(norms, 1e-12)
    return c.astype(np.float32)


def _num_generated(num_nodes: int, avg_degree: float, symmetrize: bool) -> int:
    if avg_degree < 0:
        raise ValueError(f"avg_degree must be >= 0, got {avg_degree}")
    return int(round(num_nodes * avg_degree / (2.0 if symmetrize else 1.0)))


def _generated_csc(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    symmetrize: bool,
    add_self_loops: bool,
    dedup: bool,
    reorder: str | None,
    progress: bool,
) -> CSC:
    """The CSC of generated edges. With ``symmetrize`` every generated non-loop edge is
    mirrored here (the generators draw half of the edges), so ``build_csc`` finds no
    reverse missing and adds none."""
    if symmetrize:
        off = src != dst
        src, dst = np.concatenate([src, dst[off]]), np.concatenate([dst, src[off]])
    return build_csc(
        src,
        dst,
        num_nodes,
        symmetrize=symmetrize,
        add_self_loops=add_self_loops,
        dedup=dedup,
        reorder=reorder,
        progress=progress,
    )


def _finish(
    csc: CSC,
    *,
    feature_dim: int,
    labels: np.ndarray | None,
    num_classes: int,
    separation: float,
    seed: int,
    feature_dtype: str,
    out: str | Path | None,
    overwrite: bool,
    progress: bool,
) -> GraphStore:
    from hopserve.worker.graph.store import GraphStore

    storage_labels = None
    if labels is not None:
        storage_labels = labels if csc.perm is None else labels[csc.perm]
    centroids = _centroids(seed, num_classes, feature_dim, separation) if num_classes else None
    feats = GaussianFeatures(
        csc.num_nodes,
        feature_dim,
        seed=seed,
        dtype=feature_dtype,
        labels=storage_labels,
        centroids=centroids,
    )
    contents = contents_from_csc(csc, feats, labels=labels, features_in_storage_order=True)
    if out is None:
        return GraphStore._from_arrays(materialize(contents, progress=progress))
    write_contents(out, contents, overwrite=overwrite, progress=progress)
    return GraphStore.open(out)


def _check_common(num_nodes: int, feature_dim: int, feature_dtype: str) -> None:
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    if feature_dim < 0:
        raise ValueError(f"feature_dim must be >= 0, got {feature_dim}")
    if feature_dtype not in ("float32", "float16"):
        raise ValueError(f"feature_dtype must be float32 or float16, got {feature_dtype!r}")


def synth_powerlaw(
    num_nodes: int,
    avg_degree: float,
    feature_dim: int,
    *,
    seed: int = 0,
    num_classes: int = 0,
    separation: float = 2.0,
    symmetrize: bool = False,
    add_self_loops: bool = False,
    dedup: bool = False,
    reorder: str | None = "rcmk",
    feature_dtype: Literal["float32", "float16"] = "float32",
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> GraphStore:
    """R-MAT power-law graph (directed unless ``symmetrize``).

    With ``num_classes > 0`` nodes get uniform random labels and class-centroid features
    (the structure carries no label signal). Written to ``out`` (atomically) when given,
    else kept in memory.
    """
    _check_common(num_nodes, feature_dim, feature_dtype)
    if out is not None:
        check_target(out, overwrite=overwrite)
    t0 = time.perf_counter()
    m = _num_generated(num_nodes, avg_degree, symmetrize)
    src, dst = rmat_edges(num_nodes, m, seed=seed, progress=progress)
    labels = None
    if num_classes:
        labels = _rng(seed, _STREAM_NODES).integers(0, num_classes, num_nodes)
    log.info("generated %d R-MAT edges in %.1fs", m, time.perf_counter() - t0)
    csc = _generated_csc(src, dst, num_nodes, symmetrize, add_self_loops, dedup, reorder, progress)
    del src, dst  # edge lists can be GBs; the CSC holds what is needed
    return _finish(
        csc,
        feature_dim=feature_dim,
        labels=labels,
        num_classes=num_classes,
        separation=separation,
        seed=seed,
        feature_dtype=feature_dtype,
        out=out,
        overwrite=overwrite,
        progress=progress,
    )


def synth_sbm(
    num_nodes: int,
    num_classes: int,
    avg_degree: float,
    feature_dim: int,
    *,
    intra_fraction: float = 0.8,
    separation: float = 2.0,
    seed: int = 0,
    symmetrize: bool = False,
    add_self_loops: bool = False,
    dedup: bool = False,
    reorder: str | None = "rcmk",
    feature_dtype: Literal["float32", "float16"] = "float32",
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> GraphStore:
    """Stochastic block model: ``num_classes`` balanced blocks, labels = block.

    ``intra_fraction`` is the expected fraction of generated edges inside a block
    (symmetrizing keeps it). Features are class centroid + unit Gaussian noise.
    """
    _check_common(num_nodes, feature_dim, feature_dtype)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if out is not None:
        check_target(out, overwrite=overwrite)
    m = _num_generated(num_nodes, avg_degree, symmetrize)
    labels = _rng(seed, _STREAM_NODES).permutation(np.arange(num_nodes) % num_classes)
    src, dst = sbm_edges(labels, m, intra_fraction=intra_fraction, seed=seed)
    csc = _generated_csc(src, dst, num_nodes, symmetrize, add_self_loops, dedup, reorder, progress)
    del src, dst  # edge lists can be GBs; the CSC holds what is needed
    return _finish(
        csc,
        feature_dim=feature_dim,
        labels=labels,
        num_classes=num_classes,
        separation=separation,
        seed=seed,
        feature_dtype=feature_dtype,
        out=out,
        overwrite=overwrite,
        progress=progress,
    )
