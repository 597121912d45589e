"""The planner: which nodes each layer must compute for a target set (DGI §3.3), numpy only.

For an L-layer model and targets :math:`T`, :math:`V^L = T` and
:math:`V^{l-1} = V^l \\cup N_{in}(V^l)` (or the *sampled* in-neighbours, for sampling
evaluation). ``V^0`` are the rows a node-wise block 0 (ops before the first conv) reads.
DGI's shortcut: once :math:`|V^l| \\cdot d_{avg} \\ge n`, all lower frontiers are taken to
be every node (annotation would cost more than it saves).

One home for planning, over a graph's topology alone (``indptr``, ``indices``; no
features, no torch): the front-end plans exact batches here before dispatching them, the
worker plans sampling jobs and library calls here, and the engine reads in-edge segments
with :func:`segment_positions`.

Sampling is per node and per layer, keyed by ``(seed, layer, CSC edge position)``
(:func:`edge_keys`): a node's sampled neighbours do not depend on which other targets
share its batch, so coalesced requests get the same embeddings as separate ones. The
sampled graph of layer :math:`l` with fanout :math:`f_l` is :math:`G_l`: *every* node keeps
exactly its sampled in-edges (:math:`f_l = -1` keeps all, :math:`G_l = G`). Sampling
evaluation is defined as the model's forward with each conv of layer :math:`l` run on
:math:`G_l`, degree statistics of :math:`G_l` included; :func:`sampled_in_degrees`,
:func:`sampled_out_degrees` and :func:`sampled_csc` give those statistics from the same
hash, so there is one definition of the sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "LayerFrontier",
    "Plan",
    "Topology",
    "edge_keys",
    "field_balls",
    "field_edges",
    "plan_frontiers",
    "receptive_field",
    "sample_in_edges",
    "sampled_csc",
    "sampled_in_degrees",
    "sampled_out_degrees",
    "segment_positions",
    "sorted_union",
]


class Topology(Protocol):
    """What planning reads of a graph (:class:`~.topology.GraphTopology` has it)."""

    indptr: np.ndarray
    indices: np.ndarray

    @property
    def num_nodes(self) -> int: ...

    @property
    def avg_degree(self) -> float: ...


@dataclass
class LayerFrontier:
    """The destination rows of one layer and where their in-edges come from.

    ``nodes`` is ``None`` for *all nodes* (identity positions). For sampled layers,
    ``indptr``/``indices``/``edge_ids`` is a CSC local to ``nodes`` (position-indexed) and
    ``fanout``/``seed`` say which sampled graph :math:`G_l` it is part of; otherwise
    in-edges are read from the graph's CSC.
    """

    nodes: np.ndarray | None
    """Ascending int64 storage ids, or ``None`` for all nodes."""
    indptr: np.ndarray | None = None
    """Sampled layers: local CSC offsets ``[len(nodes) + 1]``."""
    indices: np.ndarray | None = None
    """Sampled layers: the kept in-neighbours (storage ids)."""
    edge_ids: np.ndarray | None = None
    """Sampled layers: the kept edges' positions in the graph's CSC."""
    planned: bool = True
    """False: not materialized because nothing reads it (size 0)."""
    reused: np.ndarray | None = None
    """Exact layers: the rows of ``nodes`` taken from the layer cache instead of computed
    (ascending; ``None`` = none). Their in-neighbours are not in the layer below."""
    fanout: int | None = None
    """Sampled layers: the fanout (-1 = all in-edges)."""
    seed: int | None = None
    """Sampled layers: the sampling seed."""

    def size(self, num_nodes: int) -> int:
        """Rows this layer computes."""
        if not self.planned:
            return 0
        total = num_nodes if self.nodes is None else int(self.nodes.size)
        return total - (0 if self.reused is None else int(self.reused.size))

    def computed(self) -> LayerFrontier:
        """This layer without its reused rows: the frontier its batches run over."""
        if self.reused is None or self.reused.size == 0:
            return self
        assert self.nodes is not None and not self.sampled
        keep = np.ones(self.nodes.size, dtype=bool)
        keep[np.searchsorted(self.nodes, self.reused)] = False
        return LayerFrontier(self.nodes[keep])

    @property
    def sampled(self) -> bool:
        return self.indptr is not None


@dataclass
class Plan:
    """Per-layer frontiers ``layers[0] = V^0 … layers[L] = V^L``."""

    layers: list[LayerFrontier]
    fanouts: list[int] | None

    def sizes(self, num_nodes: int) -> list[int]:
        """``|V^0| … |V^L|``."""
        return [f.size(num_nodes) for f in self.layers]

    @property
    def frontiers(self) -> tuple[np.ndarray | None, ...]:
        """``V^0 … V^L`` as a job carries them (``None`` = all nodes or not planned)."""
        return tuple(f.nodes for f in self.layers)


def segment_positions(indptr: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSC positions of the in-edges of ``nodes`` (concatenated) and per-node counts.

    Built as a running sum of steps (1 inside a segment, a jump at each segment start),
    which stays cheap when a few hub segments hold most of the edges.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    starts = indptr[nodes]
    counts = indptr[nodes + 1] - starts
    keep = counts > 0
    s, c = starts[keep], counts[keep]
    total = int(c.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64), counts
    steps = np.ones(total, dtype=np.int64)
    begins = np.cumsum(c) - c
    steps[0] = s[0]
    steps[begins[1:]] = s[1:] - (s[:-1] + c[:-1] - 1)
    return np.cumsum(steps), counts


def sorted_union(num_nodes: int, *parts: np.ndarray) -> np.ndarray:
    """Sorted unique int64 storage ids of ``parts``.

    A node bitmap costs O(N + E) against sorting's O(E log E); it wins unless the graph is
    much larger than the ids.
    """
    total = sum(int(np.size(p)) for p in parts)
    if total and num_nodes <= 32 * total:
        mark = np.zeros(num_nodes, dtype=bool)
        for p in parts:
            mark[p] = True
        return np.flatnonzero(mark)
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def edge_keys(pos: np.ndarray, layer: int, seed: int) -> np.ndarray:
    """The sampling key (uint64) of each CSC edge position ``pos`` at ``layer``."""
    with np.errstate(over="ignore"):
        # Any uint64 seed (the wire allows all): mix seed and layer as separate words.
        seed_word = np.array([int(seed) % 2**64], dtype=np.uint64)
        salt = _splitmix64(_splitmix64(seed_word) ^ np.uint64(layer))
        return _splitmix64(np.asarray(pos).astype(np.uint64) ^ salt)


def sample_in_edges(
    indptr: np.ndarray, nodes: np.ndarray, fanout: int, layer: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``fanout`` in-edges per node, chosen by a per-edge hash (without replacement).

    Each node keeps its ``min(deg, fanout)`` in-edges with the smallest :func:`edge_keys`
    (ties impossible: keys are a bijection of positions), listed in CSC order;
    ``fanout = -1`` keeps all. A node's sample depends only on the node, the layer and
    the seed.

    Returns:
        (local indptr ``[len(nodes)+1]``, CSC edge positions of the kept edges).
    """
    pos, counts = segment_positions(indptr, nodes)
    local = np.zeros(counts.size + 1, dtype=np.int64)
    if fanout < 0 or counts.size == 0 or int(counts.max()) <= fanout:
        np.cumsum(counts, out=local[1:])
        return local, pos
    keys = edge_keys(pos, layer, seed)
    seg = np.repeat(np.arange(counts.size), counts)
    order = np.lexsort((keys, seg))  # by segment, then by key
    starts = np.cumsum(counts) - counts
    rank = np.arange(order.size) - np.repeat(starts, counts)
    keep = order[rank < fanout]
    keep.sort()  # CSC order within each segment
    np.cumsum(np.minimum(counts, fanout), out=local[1:])
    return local, pos[keep]


def sampled_csc(indptr: np.ndarray, fanout: int, layer: int, seed: int) -> tuple[np.ndarray, ...]:
    """:math:`G_l` for all nodes: (indptr ``[N+1]``, CSC positions of the kept edges).

    Cost: O(E) hashing and an O(E log E) sort when ``fanout`` is below the maximum degree.
    """
    return sample_in_edges(indptr, np.arange(indptr.size - 1), fanout, layer, seed)


def sampled_in_degrees(
    indptr: np.ndarray,
    indices: np.ndarray,
    nodes: np.ndarray,
    fanout: int,
    layer: int,
    seed: int,
    self_loops: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""In-degree of ``nodes`` in :math:`G_l`, and how many of those edges are self-loops.

    :math:`d^{in}_{G_l}(v) = \min(d^{in}(v), f)`. The self-loop count needs the node's
    sample only when it has a loop in the graph and more in-edges than ``fanout``: with
    ``self_loops`` (each node's self-loop count in the whole graph, integer ``[N]``) only
    those nodes are sampled, O(their in-degree); without it every node of ``nodes`` is.

    Returns:
        (in-degree, self-loop count), int64 ``[len(nodes)]`` each.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    deg = indptr[nodes + 1] - indptr[nodes]
    kept = deg if fanout < 0 else np.minimum(deg, fanout)
    if self_loops is None:
        hard = np.ones(deg.shape, dtype=bool)
        loops = np.zeros_like(deg)
    else:
        loops = self_loops[nodes].astype(np.int64)
        hard = (loops > 0) & (deg > kept)  # some loop, some edge dropped
    if hard.any():
        which = nodes[hard]
        local, pos = sample_in_edges(indptr, which, fanout, layer, seed)
        counts = np.diff(local)
        is_loop = indices[pos].astype(np.int64) == np.repeat(which, counts)
        seg = np.repeat(np.arange(which.size), counts)
        loops[hard] = np.bincount(seg[is_loop], minlength=which.size)
    return kept, loops


def sampled_out_degrees(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_nodes: int,
    fanout: int,
    layer: int,
    seed: int,
    out_degrees: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Out-degree of every node in :math:`G_l`, int64 ``[N]``; with ``weights`` (``[E]``,
    CSC order) the weighted out-degree, float64 ``[N]``: the sum of the weights of the
    node's out-edges in :math:`G_l`.

    A node's out-edges in :math:`G_l` are decided by its out-neighbours' samples, so this
    needs :math:`G_l` for all nodes. Only nodes with more in-edges than ``fanout`` lose
    edges: their in-edges are sampled and the rest are counted as in the whole graph
    (``out_degrees``, the whole graph's, if given). Cost: O(N) plus hashing and sorting
    the in-edges of those nodes (O(E log E) at worst; weighted, a pass over the weights
    too); callers cache the result per ``(graph, layer, fanout, seed)``.
    """
    if weights is not None:
        w = np.asarray(weights)
        out = np.bincount(indices, weights=w, minlength=num_nodes)  # float64
        big = np.flatnonzero(np.diff(indptr) > fanout) if fanout >= 0 else np.empty(0, np.int64)
        if big.size:
            all_pos, _ = segment_positions(indptr, big)
            _, kept = sample_in_edges(indptr, big, fanout, layer, seed)
            out -= np.bincount(indices[all_pos], weights=w[all_pos], minlength=num_nodes)
            out += np.bincount(indices[kept], weights=w[kept], minlength=num_nodes)
        return out
    if out_degrees is None:
        out = np.bincount(indices, minlength=num_nodes).astype(np.int64)
    else:
        out = out_degrees.astype(np.int64, copy=True)
    if fanout < 0:
        return out
    big = np.flatnonzero(np.diff(indptr) > fanout)
    if big.size == 0:
        return out
    all_pos, _ = segment_positions(indptr, big)
    _, kept = sample_in_edges(indptr, big, fanout, layer, seed)
    out -= np.bincount(indices[all_pos], minlength=num_nodes)
    out += np.bincount(indices[kept], minlength=num_nodes)
    return out


def plan_frontiers(
    graph: Topology,
    targets: np.ndarray,
    num_layers: int,
    fanouts: Sequence[int] | None = None,
    seed: int = 0,
    shortcut: bool = True,
    input_layer: bool = True,
    reusable: Mapping[int, np.ndarray] | None = None,
) -> Plan:
    r"""BFS-annotate ``V^L … V^0`` from storage-id ``targets``.

    With ``reusable`` (exact evaluation), a frontier stops at cached rows: for
    ``1 <= l < L``, the nodes of :math:`V^l` marked in ``reusable[l]`` (a bool mask over
    storage ids) are *reused* (``layers[l].reused``), and only the computed rest
    :math:`C^l` pulls in neighbours: :math:`V^{l-1} = C^l \cup N_{in}(C^l)`.

    Args:
        graph: the graph's topology (``indptr``, ``indices``, ``num_nodes``,
            ``avg_degree``; a :class:`~.topology.GraphTopology`).
        targets: storage ids (any order, duplicates allowed).
        num_layers: L.
        fanouts: per-layer fanouts (``fanouts[l-1]`` for layer ``l``; -1 = all) for
            sampling evaluation, or ``None`` for exact evaluation.
        seed: sampling seed.
        shortcut: apply DGI's all-nodes shortcut (exact evaluation only).
        input_layer: annotate ``V^0``. Only a node-wise block 0 reads it (layer 1 reads
            raw features by storage id), and on power-law graphs it is the costliest
            frontier; without it ``layers[0]`` is an unplanned placeholder (size 0).
        reusable: per layer ``l`` (``1 <= l < L``), the nodes whose layer-``l`` rows the
            run can take from the layer cache (:mod:`~hopserve.worker.engine.layer_cache`).
    """
    if reusable and fanouts is not None:
        raise ValueError("cached layer rows are exact: sampling evaluation cannot reuse them")
    n = graph.num_nodes
    if fanouts is not None and len(fanouts) != num_layers:
        raise ValueError(f"fanouts has {len(fanouts)} entries; the model has {num_layers} layers")
    indptr, indices = graph.indptr, graph.indices
    current: np.ndarray | None = sorted_union(n, np.asarray(targets, dtype=np.int64))
    layers: list[LayerFrontier] = [LayerFrontier(current)]
    for layer in range(num_layers, 0, -1):
        last = layer == 1 and not input_layer
        if fanouts is None:
            mask = reusable.get(layer) if reusable and layer < num_layers else None
            if mask is not None and current is not None:
                hit = mask[current[current < mask.size]]
                if hit.any():
                    layers[-1].reused = current[: hit.size][hit]
                    current = np.concatenate([current[: hit.size][~hit], current[hit.size :]])
            if last:
                layers.append(LayerFrontier(None, planned=False))
                continue
            if current is None or (shortcut and current.size * graph.avg_degree >= n):
                current = None
            elif current.size == 0:  # every row of this layer is reused
                pass
            else:
                pos, _ = segment_positions(indptr, current)
                current = sorted_union(n, current, indices[pos])
            layers.append(LayerFrontier(current))
        else:
            assert current is not None
            fanout = int(fanouts[layer - 1])
            local, pos = sample_in_edges(indptr, current, fanout, layer, seed)
            nbrs = indices[pos].astype(np.int64)
            layers[-1] = LayerFrontier(current, local, nbrs, pos, fanout=fanout, seed=int(seed))
            if last:
                layers.append(LayerFrontier(None, planned=False))
                continue
            current = sorted_union(n, current, nbrs)
            layers.append(LayerFrontier(current))
    layers.reverse()  # layers[0] = V^0, layers[L] = V^L (with layer L's sampled in-edges)
    return Plan(layers, list(fanouts) if fanouts is not None else None)


# ------------------------------------------------------- node-wise receptive fields
def receptive_field(
    topo,  # noqa: ANN001 - a GraphTopology
    targets: np.ndarray,
    depth: int,
    both_ways: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(field, inner)``: sorted storage ids within ``depth`` hops of ``targets``, and
    within ``depth - 1`` (the nodes whose edges the subgraph holds; the targets when
    ``depth`` is 0), over in-edges or, ``both_ways``, over in- and out-edges."""
    balls = field_balls(topo, targets, depth, both_ways)
    return balls[-1], balls[-2] if depth >= 1 else balls[-1]


def field_balls(topo, targets: np.ndarray, depth: int, both_ways: bool = False) -> list[np.ndarray]:  # noqa: ANN001
    """Sorted storage ids within ``0 … depth`` hops of ``targets`` (``balls[k]``: within
    ``k``), over in-edges (:func:`plan_frontiers`' exact frontiers, no shortcut) or,
    ``both_ways``, over in- and out-edges (``topo.out_neighbours``)."""
    if not both_ways:
        plan = plan_frontiers(topo, targets, depth, None, shortcut=False)
        return [f.nodes for f in reversed(plan.layers)]
    n = topo.num_nodes
    balls = [sorted_union(n, np.asarray(targets, dtype=np.int64))]
    for _ in range(depth):
        ball = balls[-1]
        pos, _ = segment_positions(topo.indptr, ball)
        balls.append(sorted_union(n, ball, topo.indices[pos], topo.out_neighbours(ball)))
    return balls


def field_edges(topo, inner: np.ndarray, both_ways: bool = False) -> np.ndarray:  # noqa: ANN001
    """Ascending CSC positions of a field subgraph's edges: every in-edge of ``inner``
    (sorted storage ids) and, ``both_ways``, every out-edge too."""
    pos, _ = segment_positions(topo.indptr, inner)
    if not both_ways:
        return pos
    heads = np.unique(topo.out_neighbours(inner))
    head_pos, _ = segment_positions(topo.indptr, heads)  # the heads' in-edges ...
    src = topo.indices[head_pos].astype(np.int64)
    at = np.minimum(np.searchsorted(inner, src), max(inner.size - 1, 0))
    from_inner = inner[at] == src if inner.size else np.zeros(src.size, dtype=bool)
    return np.union1d(pos, head_pos[from_inner])  # ... whose source is inner
