"""Array-level building: input validation and CSC construction (vectorized numpy).

:func:`build_csc` turns an edge list ``src -> dst`` over nodes ``0..N-1`` into CSC:
optional symmetrize (add only the MISSING reverse edges, see below), optional self-loops
(``(v, v)`` for every ``v`` lacking one), optional dedup (drop repeated ``(s, d)``
pairs), then one int64 key sort by ``(dst, src)``, and optionally RCMK reorder
(:mod:`~.reorder`) keeping the permutation. No Python loop over edges or nodes. With
``track_edges`` both sorts are stable argsorts and :attr:`CSC.edge_order` says which input
edge each stored edge is, so per-edge columns (weights, features) follow their edges.
:mod:`~.plan` then pairs the CSC with features, labels and IDs and writes the store.

Symmetrize rule (multigraphs included): the result is the elementwise maximum
``max(A, A^T)`` of the edge multiplicities. For every ordered pair ``(s, d)``, ``s != d``,
occurring ``c(s, d)`` times, ``max(0, c(s, d) - c(d, s))`` copies of ``(d, s)`` are added,
so an already symmetric list is unchanged, a directed one gets exactly its missing
reverses, and both directions of a pair end with the same multiplicity (in-degree equals
out-degree). Self-loops are never mirrored; duplicates are kept as given unless ``dedup``
(which then yields the simple graph ``A | A^T``). The number of edges added is reported in
:attr:`CSC.stats` and logged.

Limits: ``N`` must be below ``3.03e9`` (the ``dst * N + src`` key must fit in int64).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hopserve.worker.graph.format import GraphFlags, indices_dtype_for
from hopserve.worker.graph.ids import first_duplicate
from hopserve.worker.graph.progress import progress_bar
from hopserve.worker.graph.reorder import permute_csc, rcmk_permutation

__all__ = [
    "CSC",
    "BuildStats",
    "MAX_NODES",
    "missing_reverse_keys",
    "mirrored_reverse_edges",
    "normalize_reorder",
    "validate_edges",
    "validate_labels",
    "validate_node_ids",
    "validate_edge_weight",
    "validate_edge_features",
    "build_csc",
]

log = logging.getLogger(__name__)

Ordering = Literal["rcmk", "identity"]
MAX_NODES = 3_037_000_499  # floor(sqrt(2**63 - 1)): dst * N + src must fit in int64


def normalize_reorder(reorder: str | None) -> Ordering:
    """``"rcmk"`` -> ``"rcmk"``; ``None`` / ``"none"`` / ``"identity"`` -> ``"identity"``."""
    if reorder is None or str(reorder).lower() in ("none", "identity"):
        return "identity"
    if str(reorder).lower() == "rcmk":
        return "rcmk"
    raise ValueError(f"unknown reorder {reorder!r}: expected 'rcmk' or None/'none'")


def as_int64(a: Any, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.size == 0 and arr.dtype.kind not in "iu":  # e.g. an empty Python list
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        first = int(arr[arr > np.iinfo(np.int64).max][0])
        raise ValueError(f"{what} has values beyond the int64 range (e.g. {first})")
    return arr.astype(np.int64, copy=False)


def validate_edges(src: Any, dst: Any, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Check an edge list: 1-D integer arrays of equal length with values in ``0..N-1``.

    Returns:
        ``(src, dst)`` as int64 (no copy when already int64).

    Raises:
        ValueError: naming the first offending edge.
    """
    src, dst = as_int64(src, "src"), as_int64(dst, "dst")
    if src.ndim != 1 or dst.ndim != 1 or src.size != dst.size:
        raise ValueError(f"src/dst must be 1-D of equal length, got {src.shape} and {dst.shape}")
    n = int(num_nodes)
    if n < 0 or n > MAX_NODES:
        raise ValueError(f"num_nodes={n} out of the supported range 0..{MAX_NODES}")
    for name, arr in (("src", src), ("dst", dst)):
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            bad = int(np.flatnonzero((arr < 0) | (arr >= n))[0])
            raise ValueError(
                f"edge {bad}: {name}={int(arr[bad])} out of range for {n} nodes (0..{n - 1})"
            )
    return src, dst


def validate_labels(labels: Any, num_nodes: int) -> np.ndarray:
    """Labels: 1-D integers of length N, ``>= -1`` (``-1`` = unlabeled). Returns int64."""
    arr = as_int64(labels, "labels")
    if arr.shape != (num_nodes,):
        raise ValueError(f"labels must have shape [{num_nodes}], got {list(arr.shape)}")
    if arr.size and arr.min() < -1:
        bad = int(np.flatnonzero(arr < -1)[0])
        raise ValueError(f"labels[{bad}] = {int(arr[bad])}: must be >= 0 (or -1 for unlabeled)")
    return arr


def validate_node_ids(node_ids: Any, num_nodes: int) -> np.ndarray:
    """External IDs: 1-D distinct integers of length N. Returns int64."""
    arr = as_int64(node_ids, "node_ids")
    if arr.shape != (num_nodes,):
        raise ValueError(f"node_ids must have shape [{num_nodes}], got {list(arr.shape)}")
    dup = first_duplicate(arr)
    if dup is not None:
        raise ValueError(
            f"duplicate external node ID {int(arr[dup[0]])} at rows {dup[1]} and {dup[0]}"
        )
    return arr


def _float_edges(values: Any, what: str, ndim: int, num_edges: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in "fiub":
        raise ValueError(f"{what} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != ndim or arr.shape[0] != num_edges:
        want = f"[{num_edges}]" if ndim == 1 else f"[{num_edges}, d_e]"
        raise ValueError(f"{what} must have shape {want} (one row per edge), got {[*arr.shape]}")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(out) if ndim == 1 else np.isfinite(out).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        value = out[bad] if ndim == 1 else arr[bad].tolist()
        raise ValueError(f"{what} of edge {bad} is not finite (float32): {value}")
    return out


def validate_edge_weight(weight: Any, num_edges: int) -> np.ndarray:
    """Edge weights: ``[E]`` finite numbers (one per input edge). Returns float32.

    Raises:
        ValueError: wrong shape, non-numeric, or NaN/Inf (naming the first bad edge).
    """
    return _float_edges(weight, "edge_weight", 1, num_edges)


def validate_edge_features(features: Any, num_edges: int) -> np.ndarray:
    """Edge features: ``[E, d_e]`` finite numbers (one row per input edge). Returns float32.

    Raises:
        ValueError: wrong shape, non-numeric, or NaN/Inf (naming the first bad edge).
    """
    return _float_edges(features, "edge_features", 2, num_edges)


@dataclass(frozen=True)
class BuildStats:
    """Edge counts of one :func:`build_csc` run (all zero for transforms not requested).

    ``input_edges + reverse_edges_added + self_loops_added - duplicates_removed`` is the
    number of stored edges.
    """

    input_edges: int = 0
    reverse_edges_added: int = 0
    self_loops_added: int = 0
    duplicates_removed: int = 0


@dataclass(frozen=True)
class CSC:
    """A CSC graph in storage order, plus how it was made.

    ``perm[s]`` is the input index of storage node ``s`` (``None`` = identity ordering).
    """

    indptr: np.ndarray  # int64 [N+1]
    indices: np.ndarray  # int32/int64 [E], ascending within each segment
    perm: np.ndarray | None
    flags: GraphFlags
    stats: BuildStats = BuildStats()
    # int64 [E]: the input edge stored at CSC position k (``track_edges``), else None
    edge_order: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return self.indptr.size - 1

    @property
    def num_edges(self) -> int:
        return self.indices.size

    @property
    def ordering(self) -> Ordering:
        return "identity" if self.perm is None else "rcmk"


def _keys_to_csc(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    dst, src = np.divmod(keys, n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src.astype(indices_dtype_for(n), copy=False)


def missing_reverse_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Keys ``dst * N + src`` of the reverse edges symmetrize must add (``max(A, A^T)``).

    For every unordered pair ``{u, v}``, ``u != v``, with ``c(u, v)`` edges ``u -> v`` and
    ``c(v, u)`` edges ``v -> u``, the result holds ``|c(u, v) - c(v, u)|`` copies of the
    rarer direction. Self-loops are ignored. One uint64 sort of the pair keys
    ``(min * N + max) * 2 + (src > dst)``, which fit because ``2 * N**2 <= 2**64 - 1`` for
    ``N <= MAX_NODES``; no per-edge lookups.

    Args:
        src, dst: int64 arrays ``[E]`` of node indices ``0..N-1`` (any order).
        num_nodes: ``N``, at most :data:`MAX_NODES`.

    Returns:
        Sorted int64 edge keys (``dst * N + src``) of the edges to add.
    """
    n = int(num_nodes)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if src.size == 0:
        return np.zeros(0, dtype=np.int64)
    pair = np.minimum(src, dst).view(np.uint64)  # fresh array, reinterpreted in place
    pair *= np.uint64(n)
    hi = np.maximum(src, dst)
    pair += hi.view(np.uint64)
    del hi
    pair <<= np.uint64(1)
    np.add(pair, src > dst, out=pair, casting="unsafe")  # direction bit
    pair.sort()
    first = np.empty(pair.size, dtype=bool)  # run starts: one run per (pair, direction)
    first[0] = True
    np.not_equal(pair[1:], pair[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    del first
    runs = pair[starts]
    del pair
    counts = np.diff(starts, append=src.size)
    del starts
    is_down = (runs & np.uint64(1)).astype(bool)
    runs >>= np.uint64(1)
    canon = runs.view(np.int64)  # min * N + max <= N**2 - 1 fits; = key of max -> min
    del runs
    # A pair has one or two runs, "up" (min -> max; self-loops too) first: the run after
    # an up run with the same pair key is its down partner.
    same_next = canon[1:] == canon[:-1]
    partner = np.zeros_like(counts)
    partner[:-1] = np.where(same_next, counts[1:], 0)
    partner[1:] += np.where(same_next, counts[:-1], 0)
    del same_next
    surplus = counts
    surplus -= partner
    del partner
    need = surplus > 0
    need &= canon % (n + 1) != 0  # v * N + v is a self-loop: never mirrored
    up_keys = canon[need & ~is_down]  # add max -> min: key = pair key; ascending already
    lo, hi = np.divmod(canon[need & is_down], n)
    down_keys = hi * n + lo  # add min -> max: key max * N + min
    del lo, hi
    down_keys.sort()
    keys = _merge_sorted(up_keys, down_keys)
    del up_keys, down_keys
    extra = need & (surplus > 1)  # rare: duplicated edges lacking (enough) reverses
    if extra.any():
        lo, hi = np.divmod(canon[extra], n)
        more = np.repeat(np.where(is_down[extra], hi * n + lo, canon[extra]), surplus[extra] - 1)
        more.sort()
        keys = _merge_sorted(keys, more)
    return keys


def mirrored_reverse_edges(
    src: np.ndarray, dst: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """The reverse edges symmetrize adds and the input edge each one mirrors.

    The same edges as :func:`missing_reverse_keys` (``max(A, A^T)``): for a pair with
    ``c(u, v) > c(v, u)`` copies, the ``u -> v`` edges beyond the first ``c(v, u)`` (in input
    order) each get a reverse ``v -> u``, which takes that edge's weight and features.

    Returns:
        ``(keys dst * N + src of the added edges, index of the input edge each mirrors)``,
        both int64, in input order of the mirrored edges.
    """
    n = int(num_nodes)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    idx = np.flatnonzero(src != dst)  # self-loops are never mirrored
    s, d = src[idx], dst[idx]
    up = (s < d).astype(np.int64)
    group = (np.minimum(s, d) * n + np.maximum(s, d)) * 2 + up  # (pair, direction)
    order = np.argsort(group, kind="stable")  # input order within a group
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if g.size else np.zeros(0, np.int64)
    counts = np.diff(np.r_[starts, g.size])
    rank = np.arange(g.size) - np.repeat(starts, counts)
    heads = g[starts]
    partner = heads ^ 1  # the other direction of the same pair
    at = np.searchsorted(heads, partner)
    found = (at < heads.size) & (heads[np.minimum(at, heads.size - 1)] == partner)
    partner_count = np.where(found, counts[np.minimum(at, heads.size - 1)], 0)
    mirror = rank >= np.repeat(partner_count, counts)
    mirrored = np.sort(idx[order[mirror]])
    return src[mirrored] * n + dst[mirrored], mirrored


def _merge_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Merge two sorted int64 arrays (a stable sort merges the two runs in linear time)."""
    if b.size == 0:
        return a
    out = np.concatenate([a, b])
    out.sort(kind="stable")
    return out


def build_csc(
    src: Any,
    dst: Any,
    num_nodes: int,
    *,
    symmetrize: bool = False,
    add_self_loops: bool = False,
    dedup: bool = False,
    reorder: str | None = "rcmk",
    progress: bool = False,
    track_edges: bool = False,
    node_groups: np.ndarray | None = None,
) -> CSC:
    """Build CSC (in-edges grouped by destination) from ``src -> dst`` edges.

    Args:
        src, dst: integer arrays ``[E]`` of node indices ``0..N-1``.
        num_nodes: ``N``.
        symmetrize: add the missing reverse edges: ``max(0, c(s, d) - c(d, s))`` copies of
            ``(d, s)`` per distinct ``(s, d)``, ``s != d`` (``c`` = multiplicity), giving
            ``max(A, A^T)``. An already symmetric list is unchanged; self-loops are never
            mirrored; duplicates are kept unless ``dedup``. The count is in ``stats``.
        add_self_loops: add ``(v, v)`` for every node without one.
        dedup: keep one copy of each distinct ``(s, d)``.
        reorder: ``"rcmk"`` or ``None``/``"none"`` (identity).
        progress: show a progress bar (stderr TTY only).
        track_edges: record :attr:`CSC.edge_order` (input edge of each stored edge), for
            graphs with edge weights or features; with ``symmetrize`` an added reverse
            edge is the input edge it mirrors (:func:`mirrored_reverse_edges`), so it gets
            that edge's data. Not with ``add_self_loops`` or ``dedup``: added loops would
            have no edge data and ``dedup`` would have to merge differing edge rows.
        node_groups: ``[N]`` non-decreasing group (node type) per node: RCMK then orders
            nodes within each group, so each group keeps its contiguous id range.

    Returns:
        The CSC, with :class:`BuildStats` of what each transform added or removed.

    Raises:
        ValueError: bad edges (see :func:`validate_edges`) or options.
    """
    ordering = normalize_reorder(reorder)
    if track_edges and (add_self_loops or dedup):
        which = [name for name, on in (("self-loops", add_self_loops), ("dedup", dedup)) if on]
        raise ValueError(
            f"{'/'.join(which)} cannot be combined with edge weights or edge features: "
            "added self-loops would have no edge data and dedup would merge differing rows; "
            "add the self-loops with their edge data to the input instead, "
            "or leave the edge data out (GraphStore.from_pyg(..., edge_data=False); "
            "from_dgl(..., edge_weight_key=None, edge_feature_key=None))"
        )
    src, dst = validate_edges(src, dst, num_nodes)
    n = int(num_nodes)
    flags = GraphFlags(symmetrized=symmetrize, self_loops=add_self_loops, dedup=dedup)
    e_in = int(src.size)
    if n == 0:
        indptr, indices = np.zeros(1, np.int64), np.zeros(0, indices_dtype_for(0))
        order = np.zeros(0, np.int64) if track_edges else None
        return CSC(indptr, indices, None, flags, BuildStats(input_edges=e_in), order)
    t0 = time.perf_counter()
    steps = 3 + (ordering == "rcmk")
    n_rev = n_loops = n_dups = 0
    with progress_bar(total=steps, desc="build CSC", unit="step", enabled=progress) as bar:
        keys = np.multiply(dst, n)
        keys += src
        missing = None
        if add_self_loops:  # symmetrize never adds loops, so the input decides which lack one
            has_loop = np.zeros(n, dtype=bool)
            has_loop[src[src == dst]] = True
            missing = np.flatnonzero(~has_loop) * (n + 1)  # ascending keys of (v, v)
            del has_loop
        origin = None
        if symmetrize and track_edges:  # the reverse edges copy the data of their mirror
            rev, mirrored = mirrored_reverse_edges(src, dst, n)
            keys = np.concatenate([keys, rev])
            origin = np.concatenate([np.arange(e_in, dtype=np.int64), mirrored])
            n_rev, rev = int(rev.size), None
            log.info("symmetrize: added %d reverse edges to %d input edges", n_rev, e_in)
        else:
            rev = missing_reverse_keys(src, dst, n) if symmetrize else None
        del src, dst
        bar.update()
        edge_order = None
        if track_edges:  # stable: input edges before the reverse edges of equal key
            edge_order = np.argsort(keys, kind="stable")
            keys = keys[edge_order]
            if origin is not None:
                edge_order = origin[edge_order]
        else:
            keys.sort()
        if rev is not None:
            n_rev = int(rev.size)
            keys = _merge_sorted(keys, rev)
            del rev
            log.info("symmetrize: added %d reverse edges to %d input edges", n_rev, e_in)
        if missing is not None:
            n_loops = int(missing.size)
            keys = _merge_sorted(keys, missing)
            del missing
        if dedup and keys.size:
            keep = np.empty(keys.size, dtype=bool)
            keep[0] = True
            np.not_equal(keys[1:], keys[:-1], out=keep[1:])
            before = keys.size
            keys = keys[keep]
            n_dups = int(before - keys.size)
            del keep
        bar.update()
        indptr, indices = _keys_to_csc(keys, n)
        del keys
        bar.update()
        perm = None
        if ordering == "rcmk":
            perm = rcmk_permutation(indptr, indices, n, symmetric=symmetrize)
            if node_groups is not None:  # RCMK order within each group's own range
                perm = perm[np.argsort(np.asarray(node_groups)[perm], kind="stable")]
            if edge_order is not None:
                indptr, indices, moved = permute_csc(indptr, indices, perm, edge_order=True)
                edge_order = edge_order[moved]
            else:
                indptr, indices = permute_csc(indptr, indices, perm)
            bar.update()
    log.info(
        "built CSC: %d nodes, %d edges, ordering=%s in %.1fs",
        n,
        indices.size,
        ordering,
        time.perf_counter() - t0,
    )
    stats = BuildStats(e_in, n_rev, n_loops, n_dups)
    return CSC(indptr, indices, perm, flags, stats, edge_order)
