"""Dict models with per-relation edge data (``forward(x_dict, edge_index_dict,
edge_attr_dict)``): ``HeteroConv`` passing each relation's edge features (positionally or
as ``edge_attr_dict=``) or weights to its relation convs, and ``to_hetero`` of a model
taking ``edge_attr``, served from a typed store's edge columns, equal their own forward
per node type, full and partial; the edge data matters; a store without it is refused
naming the argument."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact
from torch import nn
from torch_geometric import nn as pyg
from torch_geometric.data import HeteroData

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.trace.tracer import ModelTraceError

H, D_E = 8, 3
RELATIONS = [
    ("account", "uses", "device"),
    ("device", "used-by", "account"),
    ("account", "pays", "account"),  # a same-type relation
    ("merchant", "paid-by", "account"),
    ("account", "shops-at", "merchant"),
]


def _data(seed: int) -> HeteroData:
    gen = torch.Generator().manual_seed(seed)
    counts = {"account": 25, "device": 10, "merchant": 6}
    widths = {"account": 5, "device": 3, "merchant": 4}
    data = HeteroData()
    for t, n in counts.items():
        data[t].x = torch.randn(n, widths[t], generator=gen)
    for s, r, d in RELATIONS:
        e = 50
        ei = torch.stack([torch.randint(0, counts[s], (e,), generator=gen),
                          torch.randint(0, counts[d] - 1, (e,), generator=gen)])  # fmt: skip
        data[s, r, d].edge_index = torch.cat([ei, ei[:, :3]], dim=1)  # duplicates
        data[s, r, d].edge_attr = torch.randn(e + 3, D_E, generator=gen)
        data[s, r, d].edge_weight = torch.rand(e + 3, generator=gen) + 0.5
    return data


class Positional(nn.Module):
    """``HeteroConv`` of ``GATConv`` / ``TransformerConv`` with ``edge_dim``, edge features
    passed positionally, then a second layer passing them as ``edge_attr_dict=``."""

    def __init__(self, metadata) -> None:
        super().__init__()

        def conv(k: int) -> nn.Module:
            if k % 2:
                return pyg.GATConv((-1, -1), H, edge_dim=D_E, add_self_loops=False)
            return pyg.TransformerConv((-1, -1), H, edge_dim=D_E)

        self.conv1 = pyg.HeteroConv({et: conv(k) for k, et in enumerate(metadata[1])})
        self.conv2 = pyg.HeteroConv(
            {
                et: pyg.GATConv((-1, -1), 4, edge_dim=D_E, add_self_loops=False)
                for et in metadata[1]
            },
            aggr="mean",
        )

    def forward(self, x_dict, edge_index_dict, edge_attr_dict):
        h = self.conv1(x_dict, edge_index_dict, edge_attr_dict)
        h = {t: v.relu() for t, v in h.items()}
        return self.conv2(h, edge_index_dict, edge_attr_dict=edge_attr_dict)


class Weighted(nn.Module):
    """``HeteroConv`` of ``GraphConv`` with per-relation edge weights."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.conv = pyg.HeteroConv({et: pyg.GraphConv((-1, -1), H) for et in metadata[1]})

    def forward(self, x_dict, edge_index_dict, edge_weight_dict):
        return self.conv(x_dict, edge_index_dict, edge_weight_dict=edge_weight_dict)


class EdgeGAT(nn.Module):
    """The homogeneous model ``to_hetero`` rewrites: GAT over edge features, then SAGE."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg.GATConv((-1, -1), H, edge_dim=D_E, add_self_loops=False)
        self.conv2 = pyg.SAGEConv((-1, -1), 4)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index)


def _model(family: str, data: HeteroData) -> nn.Module:
    md = data.metadata()
    torch.manual_seed(0)
    model = {
        "positional": lambda: Positional(md),
        "weighted": lambda: Weighted(md),
        "to_hetero": lambda: pyg.to_hetero(EdgeGAT(), md, aggr="sum"),
    }[family]()
    return model


def _args(family: str, data: HeteroData) -> tuple:
    key = "edge_weight" if family == "weighted" else "edge_attr"
    return data.x_dict, data.edge_index_dict, {et: data[et][key] for et in data.edge_types}


@pytest.mark.parametrize("family", ["positional", "weighted", "to_hetero"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dict_models_with_edge_data_equal_their_forward(family, seed):
    data = _data(seed)
    model = _model(family, data)
    with torch.no_grad():
        model(*_args(family, data))  # lazy shapes
        model.eval()
        want = model(*_args(family, data))
    store = GraphStore.from_pyg(data)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=4, progress=False)  # self-check on
    full = ev.evaluate()
    offsets = {t.name: t.offset for t in store.node_types}
    targets, rows = [], []
    for t, rows_t in want.items():
        ids = torch.arange(rows_t.shape[0])
        assert_exact(full[offsets[t] + ids, : rows_t.shape[1]], rows_t, f"{family} full {t}")
        pick = torch.tensor([0, rows_t.shape[0] - 1, 2, 2])
        targets.append(offsets[t] + pick)
        rows.append(rows_t[pick])
    got = ev.evaluate(targets=torch.cat(targets))
    assert_exact(got[:, : rows[0].shape[1]], torch.cat(rows), f"{family} partial")
    with torch.no_grad():  # the test can fail: other edge data give other rows
        x_dict, ei_dict, edge = _args(family, data)
        other = model(x_dict, ei_dict, {k: v.flip(0) for k, v in edge.items()})
    assert max((other[t] - want[t]).abs().max().item() for t in want) > 1e-3


def test_a_store_without_the_edge_data_is_refused_naming_the_argument():
    data = _data(0)
    model = _model("positional", data)
    with torch.no_grad():
        model(*_args("positional", data))
    store = GraphStore.from_pyg(data, edge_data=False)
    with pytest.raises(ModelTraceError, match="edge data 'edge_attr_dict'"):
        LayerwiseEvaluator(model.eval(), store, progress=False)
