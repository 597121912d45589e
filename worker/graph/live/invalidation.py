r"""Which embeddings a batch of mutations can change: the exact L-hop downstream set.

For an L-layer model, :math:`h^l_x` depends on :math:`h^{l-1}` of ``x`` and of its
in-neighbours, on ``x``'s in-edge list and, for degree-normalized convs, on the degrees of
``x`` and of its in-neighbours. A batch changes:

* the features of ``F`` (set_features; new nodes have no rows yet, their edges count below);
* the in-edge lists of the destinations ``D`` of added and removed edges;
* for degree-normalized convs, the in-degree of ``D`` and (for convs that read source
  out-degrees) the out-degree of the sources ``S``; a node's degree enters the rows of its
  out-neighbours.

Layer 1 rows that can change: :math:`C^1 = D \cup F \cup N_{out}(F)`, plus
:math:`N_{out}(D)` when degree-normalized (:math:`N_{out}(D \cup S)` when source
out-degrees count too); then
:math:`C^l = C^{l-1} \cup N_{out}(C^{l-1})`. The affected rows are :math:`C^L`. Out-edges
are those of the graph *after* the batch: every removed edge's destination is in
:math:`C^1`, so a path through a removed edge is covered from there.

Both ways (a model whose rows read out-neighbours too: the node-wise fallback's field of
``DirGNNConv``): a changed edge changes its destination's in-edges *and* its source's
out-edges, and a node's degree (in or out) enters the rows of its neighbours either way.
With :math:`X = D \cup S \cup F` and :math:`N(\cdot)` the in- and out-neighbours,
:math:`C^1 = X \cup N(X)` and :math:`C^l = C^{l-1} \cup N(C^{l-1})`.
"""

from __future__ import annotations

import numpy as np

from hopserve.worker.graph.live.mutations import ResolvedBatch
from hopserve.worker.graph.live.snapshot import GraphSnapshot
from hopserve.worker.graph.planner import segment_positions, sorted_union

__all__ = ["affected_nodes"]


def affected_nodes(
    after: GraphSnapshot,
    batch: ResolvedBatch,
    num_layers: int,
    degree_normalized: bool,
    source_degrees: bool | None = None,
    both_ways: bool = False,
) -> np.ndarray:
    """Sorted storage ids whose layer-``num_layers`` rows ``batch`` can change.

    ``degree_normalized``: a conv reads its neighbours' degrees; ``source_degrees``: also
    the out-degrees of the *sources* of changed edges (DGL ``GraphConv``'s norm; PyG's
    ``gcn_norm`` reads in-degrees only, which change at destinations). ``None``: as
    ``degree_normalized``. ``both_ways``: rows read in- and out-neighbours (degrees
    included). New nodes are included when something reaches them.
    """
    if both_ways:
        return _affected_both_ways(after, batch, num_layers)
    if source_degrees is None:
        source_degrees = degree_normalized
    n = after.num_nodes
    dst = np.concatenate([batch.add_dst, batch.remove_dst])
    src = np.concatenate([batch.add_src, batch.remove_src])
    feats = batch.set_nodes
    seeds = [dst, feats, after.out_neighbours(feats)]
    if degree_normalized:
        seeds.append(after.out_neighbours(sorted_union(n, dst, src) if source_degrees else dst))
    current = sorted_union(n, *seeds)
    frontier = current
    for _ in range(num_layers - 1):
        if frontier.size == 0:
            break
        reached = sorted_union(n, after.out_neighbours(frontier))
        frontier = np.setdiff1d(reached, current, assume_unique=True)
        current = sorted_union(n, current, frontier)
    return current


def _affected_both_ways(after: GraphSnapshot, batch: ResolvedBatch, num_layers: int) -> np.ndarray:
    """:math:`C^L` for rows that read in- and out-neighbours: the nodes within
    ``num_layers`` hops (either way) of the changed edges' ends and the updated rows."""
    n = after.num_nodes
    current = sorted_union(
        n, batch.add_dst, batch.remove_dst, batch.add_src, batch.remove_src, batch.set_nodes
    )
    frontier = current
    for _ in range(num_layers):
        if frontier.size == 0:
            break
        pos, _ = segment_positions(after.indptr, frontier)
        reached = sorted_union(n, after.indices[pos], after.out_neighbours(frontier))
        frontier = np.setdiff1d(reached, current, assume_unique=True)
        current = sorted_union(n, current, frontier)
    return current
