"""One small model per family the engine promises to run exactly (PyG style)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import (
    APPNP,
    DirGNNConv,
    EdgeConv,
    FAConv,
    GATConv,
    GATv2Conv,
    GCN2Conv,
    GCNConv,
    GINConv,
    GraphConv,
    JumpingKnowledge,
    SAGEConv,
    TransformerConv,
)

from support import build_family


class GCN(nn.Module):
    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5, improved: bool = False):
        super().__init__()
        self.conv1 = GCNConv(d_in, hidden, improved=improved, cached=True)
        self.conv2 = GCNConv(hidden, d_out, improved=improved)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


class TwoGCN(nn.Module):
    """Two GCNConvs with a ReLU between; ``first`` and ``second``: their keyword arguments."""

    def __init__(
        self,
        d_in: int,
        hidden: int = 16,
        d_out: int = 5,
        first: dict[str, Any] | None = None,
        second: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.conv1 = GCNConv(d_in, hidden, **(first or {}))
        self.conv2 = GCNConv(hidden, d_out, **(second or {}))

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class WeightedGCN(nn.Module):
    """Two GCNConvs trained with edge weights: ``forward(x, edge_index, edge_weight)``."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.conv1 = GCNConv(d_in, hidden)
        self.conv2 = GCNConv(hidden, d_out)

    def forward(self, x, edge_index, edge_weight=None):
        return self.conv2(self.conv1(x, edge_index, edge_weight).relu(), edge_index, edge_weight)


class GraphSAGE(nn.Module):
    """Three layers with dropout; ``aggr`` in mean / max / sum."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5, aggr: str = "mean"):
        super().__init__()
        dims = [d_in, hidden, hidden, d_out]
        self.convs = nn.ModuleList(
            SAGEConv(a, b, aggr=aggr) for a, b in zip(dims, dims[1:], strict=False)
        )

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), p=0.5, training=self.training)
        return x


class GAT(nn.Module):
    def __init__(
        self, d_in: int, hidden: int = 8, d_out: int = 5, heads: int = 3, v2: bool = False
    ):
        super().__init__()
        Conv = GATv2Conv if v2 else GATConv
        self.conv1 = Conv(d_in, hidden, heads=heads)
        self.conv2 = Conv(hidden * heads, d_out, heads=2, concat=False)

    def forward(self, x, edge_index):
        x = F.elu(self.conv1(x, edge_index))
        return self.conv2(x, edge_index)


class GIN(nn.Module):
    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()

        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU(), nn.Linear(b, b))

        self.conv1 = GINConv(mlp(d_in, hidden), train_eps=True)
        self.conv2 = GINConv(mlp(hidden, hidden))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, d_out))

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index)
        x = self.conv2(x, edge_index)
        return self.head(x)


class GraphConvNet(nn.Module):
    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.conv1 = GraphConv(d_in, hidden, aggr="add")
        self.conv2 = GraphConv(hidden, d_out, aggr="mean")

    def forward(self, x, edge_index):
        return self.conv2(torch.tanh(self.conv1(x, edge_index)), edge_index)


class JKNet(nn.Module):
    """Jumping knowledge over three convs with an input encoder, BN and residuals."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5, mode: str = "cat"):
        super().__init__()
        self.encoder = nn.Linear(d_in, hidden)
        self.convs = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(3))
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(3))
        self.jk = JumpingKnowledge(mode, hidden, num_layers=3)
        self.out = nn.Linear(3 * hidden if mode == "cat" else hidden, d_out)

    def forward(self, x, edge_index):
        x = self.encoder(x).relu()
        xs = []
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = norm(conv(x, edge_index)).relu() + x  # residual
            xs.append(x)
        return self.out(self.jk(xs))


class TwoConvsOneLayer(nn.Module):
    """Two convs in the same layer read the same input; their outputs are combined."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.conv1 = GCNConv(d_in, hidden)
        self.left = SAGEConv(hidden, d_out)
        self.right = GATConv(hidden, d_out, heads=2, concat=False)

    def forward(self, x, edge_index):
        h = self.conv1(x, edge_index).relu()
        return self.left(h, edge_index) * torch.sigmoid(self.right(h, edge_index))


class WeightShared(nn.Module):
    """One conv module applied at three layers, with an MLP head."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.conv = GraphConv(hidden, hidden)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, d_out))

    def forward(self, x, edge_index):
        x = self.inp(x)
        for _ in range(3):
            x = self.conv(x, edge_index).relu()
        return self.head(x)


class Transformer(nn.Module):
    def __init__(self, d_in: int, hidden: int = 8, d_out: int = 5):
        super().__init__()
        self.conv1 = TransformerConv(d_in, hidden, heads=2)
        self.conv2 = TransformerConv(2 * hidden, d_out, heads=1, root_weight=False)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class DynamicEdge(nn.Module):
    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.conv = EdgeConv(nn.Sequential(nn.Linear(2 * d_in, hidden), nn.ReLU()), aggr="max")
        self.lin = nn.Linear(hidden, d_out)

    def forward(self, x, edge_index):
        return self.lin(self.conv(x, edge_index))


class OneConv(nn.Module):
    """A model that is one conv: ``conv(x, edge_index)``."""

    def __init__(self, conv: nn.Module):
        super().__init__()
        self.conv = conv

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def _scale_into(t, h):  # an fx.wrap'd helper: hopserve cannot see inside it
    t.mul_(2.0)
    return t + h


torch.fx.wrap("_scale_into")


class SkipCat(nn.Module):
    """Three SAGE layers; the last block reads layer 1 (``h1``) at its destinations only
    (JKNet's concatenation). ``tail`` then writes in place: into the block's own tensors
    (``method``, ``function``, ``out``, ``keyword``, ``module``: harmless) or into ``h1``,
    one of its inputs (``input-method``, ``input-out``, ``input-aten``, ``input-helper``).
    torch.fx records ``z += y`` as an out-of-place add and cannot trace ``z[i] = v``."""

    def __init__(self, tail: str = "none") -> None:
        super().__init__()
        self.convs = nn.ModuleList([SAGEConv(6, 8), SAGEConv(8, 8), SAGEConv(8, 8)])
        self.lin = nn.Linear(24, 4)
        self.act = nn.ReLU(inplace=tail == "module")
        self.tail = tail

    def forward(self, x, edge_index):
        h1 = self.convs[0](x, edge_index).relu()
        h2 = self.convs[1](h1, edge_index).relu()
        h3 = self.convs[2](h2, edge_index)
        tail = self.tail
        if tail == "input-method":
            h1 = h1.add_(h3)
        elif tail == "input-out":
            h1 = torch.add(h1, h3, out=h1)
        elif tail == "input-aten":
            h1 = torch.ops.aten.add_.Tensor(h1, h3)
        elif tail == "input-helper":
            h1 = _scale_into(h1, h3)
        z = torch.cat([h1, h2, h3], dim=-1)
        if tail == "method":
            z = z.mul_(2.0)
        elif tail == "function":
            z = torch.relu_(z)
        elif tail == "out":
            z = torch.mul(z, 2.0, out=z)
        elif tail == "keyword":
            z = F.relu(z - 0.5, inplace=True)
        elif tail == "module":
            z = self.act(z - 0.5)
        return self.lin(z)


class ReadAndWrite(nn.Module):
    """A layer read by a conv over its source rows and written in place at its
    destinations in the same block (``h2 + h1.mul_(2)``): batches must not share it."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = SAGEConv(6, 8), SAGEConv(8, 8)

    def forward(self, x, edge_index):
        h1 = self.c1(x, edge_index).relu()
        h2 = self.c2(h1, edge_index)
        return h2 + h1.mul_(2.0)


class GCNII(nn.Module):
    """GCNII as its authors' PyG example writes it: ``x_0 = relu(lin_in(x))``, then
    ``layers`` initial-residual convs each reading ``x_0`` (``GCN2Conv``, or FAGCN's
    ``FAConv`` with ``conv="fa"``), then ``lin_out``."""

    def __init__(self, d_in: int, layers: int = 3, hidden: int = 8, conv: str = "gcn2"):
        super().__init__()
        self.lin_in = nn.Linear(d_in, hidden)
        if conv == "gcn2":
            self.convs = nn.ModuleList(
                GCN2Conv(hidden, alpha=0.1, theta=0.5, layer=i + 1) for i in range(layers)
            )
        else:
            self.convs = nn.ModuleList(FAConv(hidden, eps=0.2) for _ in range(layers))
        self.lin_out = nn.Linear(hidden, 3)

    def forward(self, x, edge_index):
        x = x_0 = self.lin_in(x).relu()
        for conv in self.convs:
            x = conv(x, x_0, edge_index).relu()
        return self.lin_out(x)


class RawFeaturesGCNII(nn.Module):
    """``x_0`` is the model's feature input itself (each conv reads the store's rows of its
    destinations), and one ``GCN2Conv`` module serves both layers."""

    def __init__(self, d_in: int):
        super().__init__()
        self.conv = GCN2Conv(d_in, alpha=0.3, theta=0.5, layer=1)
        self.lin = nn.Linear(d_in, 4)

    def forward(self, x, edge_index):
        h = self.conv(x, x, edge_index).relu()
        return self.lin(self.conv(h, x, edge_index))


class LinAPPNP(nn.Module):
    """``lin`` on the features, then APPNP over ``k`` hops: a K-hop conv, which the
    layer-wise engine refuses and the node-wise fallback serves."""

    def __init__(self, lin: nn.Module, k: int, alpha: float = 0.1):
        super().__init__()
        self.lin = lin
        self.prop = APPNP(K=k, alpha=alpha)

    def forward(self, x, edge_index):
        return self.prop(self.lin(x), edge_index)


class DirGCN(nn.Module):
    """Two ``DirGNNConv(GCNConv)`` layers: each node aggregates its in- *and*
    out-neighbours (Rossi et al. 2023), which only the node-wise fallback serves, over a
    receptive field running both ways."""

    def __init__(self, d_in: int, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.c1 = DirGNNConv(GCNConv(d_in, hidden), alpha=0.4)
        self.c2 = DirGNNConv(GCNConv(hidden, d_out), alpha=0.7)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


FAMILIES = {
    "gcn": lambda d: GCN(d),
    "gcn_improved": lambda d: GCN(d, improved=True),
    "gcn_noloops": lambda d: TwoGCN(
        d, first={"add_self_loops": False}, second={"normalize": False}
    ),
    "sage_mean": lambda d: GraphSAGE(d, aggr="mean"),
    "sage_max": lambda d: GraphSAGE(d, aggr="max"),
    "sage_sum": lambda d: GraphSAGE(d, aggr="sum"),
    "gat": lambda d: GAT(d),
    "gatv2": lambda d: GAT(d, v2=True),
    "gin": lambda d: GIN(d),
    "graphconv": lambda d: GraphConvNet(d),
    "jk_cat": lambda d: JKNet(d, mode="cat"),
    "jk_max": lambda d: JKNet(d, mode="max"),
    "jk_lstm": lambda d: JKNet(d, mode="lstm"),
    "two_convs_one_layer": lambda d: TwoConvsOneLayer(d),
    "weight_shared": lambda d: WeightShared(d),
    "transformer": lambda d: Transformer(d),
    "edgeconv": lambda d: DynamicEdge(d),
    "gcnii": lambda d: GCNII(d),
    "gcnii_raw_x0": lambda d: RawFeaturesGCNII(d),
}


def build(name: str, d_in: int, seed: int = 0) -> nn.Module:
    """A family's model with deterministic weights and non-trivial BN statistics."""
    return build_family(FAMILIES, name, d_in, seed)
