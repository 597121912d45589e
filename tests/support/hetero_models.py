"""Dict models for the typed serving tests (entrypoints ``support.hetero_models:<name>``)."""

from __future__ import annotations

from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv

__all__ = ["UserItemHeads"]


class UserItemHeads(nn.Module):
    """One ``HeteroConv`` (a ``SAGEConv`` per relation, summed), then a head of its own
    width per type: users ``user_dim`` wide, items ``item_dim`` wide
    (``forward(x_dict, edge_index_dict)`` -> ``{"user": ..., "item": ...}``)."""

    def __init__(
        self, in_dims: dict[str, int], relations: list[str], user_dim: int = 4, item_dim: int = 6
    ) -> None:
        super().__init__()
        triples = [tuple(r.split("__")) for r in relations]
        self.conv = HeteroConv(
            {(s, r, d): SAGEConv((in_dims[s], in_dims[d]), 8) for s, r, d in triples}, aggr="sum"
        )
        self.heads = nn.ModuleDict({"user": nn.Linear(8, user_dim), "item": nn.Linear(8, item_dim)})

    def forward(self, x_dict, edge_index_dict):
        h = self.conv(x_dict, edge_index_dict)
        return {t: self.heads[t](h[t].relu()) for t in ("user", "item")}
