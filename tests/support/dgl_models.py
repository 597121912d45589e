"""One small model per DGL family the engine promises to run exactly (``forward(g, x)``).

Written the way DGL's own examples write them: ``dgl.nn`` convs called ``conv(g, h)``.
Import only where DGL is installed (tests/dgl skip otherwise).
"""

from __future__ import annotations

import dgl
import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from torch import nn

from support import build_family
from support.exactness import Style


class GCN(nn.Module):
    """GraphConv, widening then narrowing (aggregate-first and W-first paths)."""

    def __init__(
        self, d_in: int, hidden: int = 16, d_out: int = 5, norm: str = "both", zero_ok=True
    ):
        super().__init__()
        kw = {"norm": norm, "allow_zero_in_degree": zero_ok}
        self.conv1 = dglnn.GraphConv(d_in, hidden, activation=F.relu, **kw)
        self.conv2 = dglnn.GraphConv(hidden, hidden, **kw)
        self.conv3 = dglnn.GraphConv(hidden, d_out, bias=False, **kw)
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, x):
        h = self.conv1(g, self.dropout(x))
        h = self.dropout(F.relu(self.conv2(g, h)))
        return self.conv3(g, h)


class GraphSAGE(nn.Module):
    """SAGEConv stack (DGL's GraphSAGE example); ``aggregator`` mean / gcn / pool / lstm."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5, aggregator: str = "mean"):
        super().__init__()
        dims = [d_in, hidden, hidden, d_out]
        self.layers = nn.ModuleList(
            dglnn.SAGEConv(a, b, aggregator) for a, b in zip(dims, dims[1:], strict=False)
        )
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(g, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


class GAT(nn.Module):
    """GATConv (with residuals unless ``residual=False``) and heads flattened, then a mean
    over output heads."""

    def __init__(
        self, d_in: int, hidden: int = 8, d_out: int = 5, heads: int = 3, residual: bool = True
    ):
        super().__init__()
        self.conv1 = dglnn.GATConv(
            d_in, hidden, heads, residual=residual, allow_zero_in_degree=True
        )
        self.conv2 = dglnn.GATConv(
            hidden * heads, d_out, 2, residual=residual, allow_zero_in_degree=True
        )

    def forward(self, g, x):
        h = F.elu(self.conv1(g, x).flatten(1))
        return self.conv2(g, h).mean(1)


class GATv2(nn.Module):
    """GATv2Conv, one layer with shared source/destination weights and one without."""

    def __init__(self, d_in: int, hidden: int = 8, d_out: int = 5, heads: int = 2):
        super().__init__()
        self.conv1 = dglnn.GATv2Conv(
            d_in, hidden, heads, residual=True, allow_zero_in_degree=True, share_weights=True
        )
        self.conv2 = dglnn.GATv2Conv(hidden * heads, d_out, 1, allow_zero_in_degree=True)

    def forward(self, g, x):
        h = F.elu(self.conv1(g, x).flatten(1))
        return self.conv2(g, h).squeeze(1)


class GIN(nn.Module):
    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5, aggregator: str = "sum"):
        super().__init__()

        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU(), nn.Linear(b, b))

        self.conv1 = dglnn.GINConv(mlp(d_in, hidden), aggregator, learn_eps=True)
        self.conv2 = dglnn.GINConv(mlp(hidden, hidden), aggregator, init_eps=0.3)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, g, x):
        h = self.conv2(g, self.conv1(g, x))
        return self.head(h)


class JKNet(nn.Module):
    """JKNet as in DGL's example / DGI's Listing 1: convs, dropout, jumping knowledge."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5, mode: str = "cat"):
        super().__init__()
        kw = {"activation": F.relu, "allow_zero_in_degree": True}
        self.layers = nn.ModuleList([dglnn.GraphConv(d_in, hidden, **kw)])
        self.layers.extend(dglnn.GraphConv(hidden, hidden, **kw) for _ in range(2))
        self.jump = dglnn.JumpingKnowledge(mode, hidden, num_layers=3)
        self.out = nn.Linear(3 * hidden if mode == "cat" else hidden, d_out)
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, x):
        hs = []
        h = x
        for layer in self.layers:
            h = self.dropout(layer(g, h))
            hs.append(h)
        return self.out(self.jump(hs))


class Misc(nn.Module):
    """EdgeConv, DotGatConv and AGNNConv in one layer each, plus a shared-weight conv."""

    def __init__(self, d_in: int, hidden: int = 8, d_out: int = 5):
        super().__init__()
        self.edge = dglnn.EdgeConv(d_in, hidden, allow_zero_in_degree=True)
        self.dot = dglnn.DotGatConv(hidden, hidden, 2, allow_zero_in_degree=True)
        self.agnn = dglnn.AGNNConv(allow_zero_in_degree=True)
        self.shared = dglnn.SAGEConv(2 * hidden, 2 * hidden, "mean")
        self.out = nn.Linear(2 * hidden, d_out)

    def forward(self, g, x):
        h = self.edge(g, x).relu()
        h = self.dot(g, h).flatten(1)
        h = self.agnn(g, h)
        for _ in range(2):
            h = self.shared(g, h).relu()
        return self.out(h)


FAMILIES = {
    "gcn_both": lambda d: GCN(d, norm="both"),
    "gcn_left": lambda d: GCN(d, norm="left"),
    "gcn_right": lambda d: GCN(d, norm="right"),
    "gcn_none": lambda d: GCN(d, norm="none"),
    "sage_mean": lambda d: GraphSAGE(d, aggregator="mean"),
    "sage_gcn": lambda d: GraphSAGE(d, aggregator="gcn"),
    "sage_pool": lambda d: GraphSAGE(d, aggregator="pool"),
    "gat": lambda d: GAT(d),
    "gat_plain": lambda d: GAT(d, residual=False),
    "gatv2": lambda d: GATv2(d),
    "gin_sum": lambda d: GIN(d, aggregator="sum"),
    "gin_max": lambda d: GIN(d, aggregator="max"),
    "jk_cat": lambda d: JKNet(d, mode="cat"),
    "jk_lstm": lambda d: JKNet(d, mode="lstm"),
    "misc": lambda d: Misc(d),
}


def build(name: str, d_in: int, seed: int = 0) -> nn.Module:
    """A family's model with deterministic weights and non-trivial BN statistics / eps."""
    return build_family(FAMILIES, name, d_in, seed, _fixed_gin_eps)


def _fixed_gin_eps(module: nn.Module) -> None:
    if isinstance(module, dglnn.GINConv) and isinstance(module.eps, torch.Tensor):
        module.eps.data.fill_(0.25)


def dgl_graph(edge_index: torch.Tensor, num_nodes: int) -> dgl.DGLGraph:
    """The DGL graph of a ``[2, E]`` edge index (row 0 = source), edge ids in given order."""
    return dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes)


DGL = Style("dgl", graph_arg=0, to_graph=dgl_graph)
