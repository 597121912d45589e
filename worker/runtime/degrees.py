"""Whether a model's rows depend on its neighbours' degrees (how far updates invalidate).

A conv that aggregates its in-neighbours with weights taken from *their* degrees (GCN's
:math:`1/\\sqrt{\\hat d_u \\hat d_v}`, DGL ``GraphConv``'s source out-degree norm) makes a
node's row change when a neighbour gains or loses an edge, one hop further than the edge
itself. Mean, sum, max and attention aggregations depend only on the destination's own
in-edges. Unknown convs count as degree-normalized: invalidating more is safe, less is not.
"""

from __future__ import annotations

__all__ = ["DEGREE_FREE", "IN_DEGREE_ONLY", "degree_normalized", "degree_reads"]

DEGREE_FREE = frozenset(
    {
        "torch_geometric:SAGEConv",
        "torch_geometric:GATConv",
        "torch_geometric:GATv2Conv",
        "torch_geometric:GINConv",
        "torch_geometric:GraphConv",
        "torch_geometric:TransformerConv",
        "torch_geometric:ResGatedGraphConv",
        "torch_geometric:LEConv",
        "torch_geometric:EdgeConv",
        "dgl:SAGEConv",
        "dgl:GATConv",
        "dgl:GATv2Conv",
        "dgl:GINConv",
        "dgl:EdgeConv",
        "dgl:DotGatConv",
    }
)
"""``library:ConvClass`` whose messages never read a neighbour's degree."""


def _key(conv: object) -> str:
    library = type(conv).__module__.split(".")[0]
    return f"{library}:{type(conv).__name__}"


IN_DEGREE_ONLY = frozenset(
    {
        "torch_geometric:GCNConv",
        "torch_geometric:LGConv",
        "torch_geometric:DNAConv",
        "torch_geometric:EGConv",
    }
)
"""Convs whose weights read in-degrees only (PyG's ``gcn_norm``: ``deg`` is summed over
edge targets), so a new edge changes its destination's degree and not its source's."""


def degree_normalized(evaluator: object) -> bool:
    """True unless every conv of the evaluator's split is known to be degree-free.

    ``GCNConv(normalize=False)`` and DGL ``GraphConv(norm="none" or "right")`` read no
    neighbour's degree either. The node-wise fallback has no split: True.
    """
    return degree_reads(evaluator)[0]


def degree_reads(evaluator: object) -> tuple[bool, bool]:
    """``(reads neighbours' degrees, reads the sources' out-degrees too)``; unknown convs
    (and the node-wise fallback) read both."""
    split = getattr(evaluator, "split", None)
    if split is None:
        return True, True
    reads, sources = False, False
    for adapter in split.adapters.values():
        conv = getattr(adapter, "conv", None)
        key = _key(conv)
        if key == "torch_geometric:GCNConv" and not getattr(conv, "normalize", True):
            continue
        if key == "dgl:GraphConv" and getattr(conv, "_norm", "both") in ("none", "right"):
            continue
        if key in DEGREE_FREE:
            continue
        reads = True
        sources = sources or key not in IN_DEGREE_ONLY
    return reads, sources
