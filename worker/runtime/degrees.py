"""Whether a model's rows depend on its neighbours' degrees (how far updates invalidate).

A conv that aggregates its in-neighbours with weights taken from *their* degrees (GCN's
:math:`1/\\sqrt{\\hat d_u \\hat d_v}`, DGL ``GraphConv``'s source out-degree norm) makes a
node's row change when a neighbour gains or loses an edge, one hop further than the edge
itself. Mean, sum, max and attention aggregations depend only on the destination's own
in-edges. Unknown convs count as degree-normalized: invalidating more is safe, less is not.
"""

from __future__ import annotations

__all__ = ["DEGREE_FREE", "degree_normalized"]

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


def degree_normalized(evaluator: object) -> bool:
    """True unless every conv of the evaluator's split is known to be degree-free.

    ``GCNConv(normalize=False)`` and DGL ``GraphConv(norm="none" or "right")`` read no
    neighbour's degree either. The node-wise fallback has no split: True.
    """
    split = getattr(evaluator, "split", None)
    if split is None:
        return True
    for adapter in split.adapters.values():
        conv = getattr(adapter, "conv", None)
        key = _key(conv)
        if key == "torch_geometric:GCNConv" and not getattr(conv, "normalize", True):
            continue
        if key == "dgl:GraphConv" and getattr(conv, "_norm", "both") in ("none", "right"):
            continue
        if key not in DEGREE_FREE:
            return True
    return False
