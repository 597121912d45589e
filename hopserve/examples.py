"""Reference models: plain PyG training code, as a user would write it.

The demo, the benchmarks and ``examples/`` configs serve these through the entrypoints
``hopserve.examples:GraphSAGE``, ``hopserve.examples:GCN``, ``hopserve.examples:RGCN``
(typed edges) and ``hopserve.examples:HeteroSAGE`` (a dict model on a typed graph).
Nothing here is special to hopserve: any ``torch.nn.Module`` with ``forward(x, edge_index)``
(or ``forward(x, edge_index, edge_type)``, or ``forward(x_dict, edge_index_dict)`` on a
typed graph) is served the same way.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, HeteroConv, RGCNConv, SAGEConv


class GraphSAGE(nn.Module):
    """``num_layers`` SAGEConv layers (mean), ReLU and dropout in between."""

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.3
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.dropout = dropout

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), p=self.dropout, training=self.training)
        return x


class GCN(nn.Module):
    """Two GCNConv layers (Kipf & Welling) with ReLU and dropout."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_dim, hidden)
        self.conv2 = GCNConv(hidden, out_dim)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


class RGCN(nn.Module):
    """``num_layers`` RGCNConv layers (Schlichtkrull et al.; mean per relation, basis
    weights), ReLU and dropout in between: ``forward(x, edge_index, edge_type)``."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_relations: int,
        num_layers: int = 2,
        num_bases: int | None = 4,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(
            RGCNConv(a, b, num_relations, num_bases=num_bases)
            for a, b in zip(dims[:-1], dims[1:], strict=True)
        )
        self.dropout = dropout

    def forward(self, x, edge_index, edge_type):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_type)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), p=self.dropout, training=self.training)
        return x


class HeteroSAGE(nn.Module):
    """``num_layers`` ``HeteroConv`` layers of one ``SAGEConv`` per relation (summed per
    destination type), ReLU and dropout in between; returns ``out_type``'s embeddings:
    ``forward(x_dict, edge_index_dict)``.

    Args:
        in_dims: input width per node type.
        relations: the graph's relations, ``"src__name__dst"`` (a typed store's names).
        out_type: the node type whose embeddings the model returns.
    """

    def __init__(
        self,
        in_dims: dict[str, int],
        hidden: int,
        out_dim: int,
        relations: list[str],
        out_type: str,
        num_layers: int = 2,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        triples = [tuple(r.split("__")) for r in relations]
        self.convs = nn.ModuleList()
        for i in range(num_layers):
            width = out_dim if i == num_layers - 1 else hidden
            self.convs.append(
                HeteroConv(
                    {
                        (s, r, d): SAGEConv(
                            (in_dims[s], in_dims[d]) if i == 0 else (hidden, hidden), width
                        )
                        for s, r, d in triples
                    },
                    aggr="sum",
                )
            )
        self.out_type = out_type
        self.dropout = dropout

    def forward(self, x_dict, edge_index_dict):
        for i, conv in enumerate(self.convs):
            x_dict = conv(x_dict, edge_index_dict)
            if i < len(self.convs) - 1:
                x_dict = {
                    t: F.dropout(x.relu(), p=self.dropout, training=self.training)
                    for t, x in x_dict.items()
                }
        return x_dict[self.out_type]
