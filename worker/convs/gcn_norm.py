"""Convs that normalize by GCN's symmetric degrees inside their forward: ``LGConv``, ``DNAConv``,
``EGConv`` (its ``"symnorm"`` aggregator), ``PDNConv`` (weights computed from edge features).

.. math::
    h_v' = \\bigoplus_{u \\in N_{in}(v) \\cup \\{v\\}}
           \\frac{w_{uv}}{\\sqrt{\\hat d_u \\hat d_v}}\\, \\phi(h_v, h_u)

Each calls PyG's ``gcn_norm`` on the graph it is given, with the conv's own
``add_self_loops`` (``LGConv``: none) and ``improved=False``.

Exactness: as for ``GCNConv`` (:mod:`.gcn`), :math:`\\hat d_u` is the *source's* in-degree
in the whole graph, which a batch does not see; the weights come from
:class:`~.gcn.GCNAdapter`'s whole-graph (or, for sampling evaluation, :math:`G_l`) degrees
and reach the conv's own forward without a second normalization:

* ``LGConv``: ``normalize`` switched off and the weights as the sparse adjacency's values
  (its fused SpMM), exactly as ``GCNConv`` runs;
* ``DNAConv`` and ``EGConv``: the weighted edge list (one self-loop per destination where
  ``gcn_norm`` adds them) is handed to the forward through its own normalization cache
  (``_cached_edge_index``, which the forward reads instead of calling ``gcn_norm``) for
  the one call, then the cache is restored. Both take one tensor, so they run on the
  square batch and the destination rows are sliced out; every other per-edge and
  per-destination quantity (attention over the layer history, EGConv's sum / mean / max
  aggregators over the same edges) sees the destination's full in-neighbourhood.

``PDNConv`` turns each edge's features into a weight (its ``mlp``, per edge) and normalizes
like a weighted GCN (``improved=False``): :math:`\\hat d_u` sums the weights of the source's
own in-edges, which a batch does not hold. ``prepare`` runs the conv's ``mlp`` once over
every edge of the graph (CSC order, in chunks) and normalizes with those weights as
:class:`~.gcn.GCNAdapter` does with stored weights; each batch then runs the conv with
``normalize`` off on the weighted adjacency (its ``mlp`` is not run again). Called without
edge features, ``PDNConv`` is an unweighted GCN, and so is its adapter.

``EGConv`` without ``"symnorm"`` but with ``add_self_loops`` is refused: its forward then
adds loops with ``add_remaining_self_loops`` *without* a node count, so nodes above the
largest id that has an edge get none — a property of the caller's node numbering, not of
the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch, UnsupportedConvError
from hopserve.worker.convs.gcn import GCNAdapter


def _edge_list(adj: Tensor) -> tuple[Tensor, Tensor]:
    """``(edge_index, weight)`` of a ``[B, n_src]`` CSR adjacency (row 0 = source)."""
    crow, col = adj.crow_indices(), adj.col_indices()
    dst = torch.repeat_interleave(torch.arange(adj.shape[0], device=col.device), crow.diff())
    return torch.stack([col, dst]), adj.values()


class LGConvAdapter(GCNAdapter):
    """``LGConv`` (LightGCN): :math:`\\hat d` without self-loops, like ``GCNConv``'s run."""

    @property
    def adds_self_loops(self) -> bool:
        return False

    @property
    def improved(self) -> bool:
        return False


class PDNConvAdapter(GCNAdapter):
    """``PDNConv``: GCN normalization by weights its ``mlp`` computes from edge features."""

    accepts_edge_data = True
    CHUNK_EDGES = 1 << 16

    def set_edge_inputs(self, inputs, model_edge_args, model_name, edge_feature_dim=None):  # noqa: ANN001
        for inp in inputs:
            if inp.param != "edge_attr" or inp.column != "features":
                raise UnsupportedConvError(
                    f"'{inp.arg}' is passed as PDNConv's '{inp.param}'; it takes edge "
                    "features (an edge_attr-like argument) only"
                )
        ConvAdapter.set_edge_inputs(self, inputs, model_edge_args, model_name, edge_feature_dim)

    @property
    def improved(self) -> bool:
        return False

    def _edge_weights(self, graph) -> Tensor:  # noqa: ANN001 - a GraphStore
        feats = self._edge_columns["features"]
        mlp = self.conv.mlp
        device = next(mlp.parameters()).device
        out = torch.empty(feats.shape[0], dtype=torch.float32)
        with torch.no_grad():
            for a in range(0, feats.shape[0], self.CHUNK_EDGES):
                rows = feats[a : a + self.CHUNK_EDGES].to(device)
                out[a : a + rows.shape[0]] = mlp(rows).squeeze(-1).float().cpu()
        return out

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        adj = self._adjacency(batch, x.dtype)
        conv = self.conv
        with self._lock:
            saved = conv.normalize
            conv.normalize = False
            try:
                return conv(x, adj)  # edge_attr None: the mlp is not run again
            finally:
                conv.normalize = saved


class _CachedNormAdapter(GCNAdapter):
    """Hands the batch's normalized edge list to the conv through ``_cached_edge_index``."""

    accepts_edge_data = False  # their forwards take no edge data

    @property
    def improved(self) -> bool:
        return False

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        n_dst = batch.num_dst
        if not self.normalizes:
            return self.conv(x, batch.edge_index)[:n_dst]
        cache = _edge_list(self._adjacency(batch, x.dtype))
        conv = self.conv
        with self._lock:
            saved = conv._cached_edge_index
            conv._cached_edge_index = cache
            try:
                out = conv(x, batch.edge_index)
            finally:
                conv._cached_edge_index = saved
        return out[:n_dst]


class DNAConvAdapter(_CachedNormAdapter):
    """``DNAConv``: attention over the layer history, weighted by whole-graph GCN norms."""


class EGConvAdapter(_CachedNormAdapter):
    """``EGConv``: ``"symnorm"`` from whole-graph degrees; other aggregators as they are."""

    def __init__(self, conv: nn.Module) -> None:
        if "symnorm" not in conv.aggregators and conv.add_self_loops:
            raise UnsupportedConvError(
                "without 'symnorm', add_self_loops=True adds loops only up to the largest "
                "node id that has an edge (PyG's add_remaining_self_loops without a node "
                "count); build it with add_self_loops=False"
            )
        super().__init__(conv)

    @property
    def normalizes(self) -> bool:
        return "symnorm" in self.conv.aggregators
