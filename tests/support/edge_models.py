"""Models that read the graph store's edge columns (for the living-graph edge data tests;
entrypoints ``support.edge_models:<name>``)."""

from __future__ import annotations

from torch import nn
from torch_geometric.nn import GATConv, GATv2Conv, GINEConv, RGCNConv

__all__ = ["EdgeFeatureNet", "GINENet", "RelationalGCN"]


class EdgeFeatureNet(nn.Module):
    """``GATConv`` then ``GATv2Conv``, both with ``edge_dim``: ``forward(x, edge_index,
    edge_attr)``."""

    def __init__(self, d_in: int, d_edge: int = 3, hidden: int = 16, d_out: int = 5) -> None:
        super().__init__()
        self.conv1 = GATConv(d_in, hidden, heads=2, concat=False, edge_dim=d_edge)
        self.conv2 = GATv2Conv(hidden, d_out, heads=2, concat=False, edge_dim=d_edge)

    def forward(self, x, edge_index, edge_attr=None):  # noqa: ANN001, ANN201
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


class GINENet(nn.Module):
    """Two ``GINEConv`` layers (``edge_dim``): ``forward(x, edge_index, edge_attr)``, which
    cannot run without the edge features (no ``edge_attr=None`` default)."""

    def __init__(self, d_in: int, d_edge: int = 3, hidden: int = 16, d_out: int = 5) -> None:
        super().__init__()
        mlp1 = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.conv1 = GINEConv(mlp1, edge_dim=d_edge)
        self.conv2 = GINEConv(nn.Linear(hidden, d_out), edge_dim=d_edge)

    def forward(self, x, edge_index, edge_attr):  # noqa: ANN001, ANN201
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


class RelationalGCN(nn.Module):
    """Two ``RGCNConv`` layers over the graph's relation ids: ``forward(x, edge_index,
    edge_type)`` (mean per relation, then sum with bases)."""

    def __init__(self, d_in: int, relations: int = 3, hidden: int = 16, d_out: int = 5) -> None:
        super().__init__()
        self.conv1 = RGCNConv(d_in, hidden, relations)
        self.conv2 = RGCNConv(hidden, d_out, relations, num_bases=2, aggr="add")

    def forward(self, x, edge_index, edge_type):  # noqa: ANN001, ANN201
        return self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)
