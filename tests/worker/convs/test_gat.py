"""PyG ``GATConv`` full layers: the source side once per layer, read in place
(:mod:`hopserve.worker.convs.gat`), equal to the model's own forward in every variant."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.exactness import (
    D_IN,
    PYG,
    check_medium_graph,
    check_random_graph,
    family_cases,
    graphs,
)
from torch import nn
from torch_geometric.nn import GATConv

from hopserve import LayerwiseEvaluator
from hopserve.worker.convs.gat import GATAdapter

VARIANTS = {
    "heads3-concat": {"heads": 3},
    "heads2-mean": {"heads": 2, "concat": False},
    "one-head": {"heads": 1},
    "no-self-loops": {"heads": 2, "add_self_loops": False},
    "residual": {"heads": 2, "residual": True},
    "src-dst-weights": {"heads": 2, "pair_in": True},
    "dropout-eval": {"heads": 2, "dropout": 0.4},
    "no-bias-slope": {"heads": 2, "bias": False, "negative_slope": 0.05},
}


class TwoGAT(nn.Module):
    """Two ``GATConv`` layers built with ``kwargs`` (``pair_in``: separate source and
    destination weights, ``in_channels`` a pair)."""

    def __init__(self, d_in: int, pair_in: bool = False, **kwargs) -> None:
        super().__init__()
        heads = kwargs.get("heads", 1)
        hidden = 4 * heads if kwargs.get("concat", True) else 4
        self.conv1 = GATConv((d_in, d_in) if pair_in else d_in, 4, **kwargs)
        self.conv2 = GATConv((hidden, hidden) if pair_in else hidden, 3, **kwargs)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


def model(variant: str, seed: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    m = TwoGAT(D_IN, **VARIANTS[variant]).eval()
    with torch.no_grad():  # PyG zero-initializes the bias; give it a value that shows
        for conv in (m.conv1, m.conv2):
            if conv.bias is not None:
                conv.bias.normal_()
    return m


@family_cases(VARIANTS, 8, graphs())
def test_random_graphs_full_and_partial(family, case):
    check_random_graph(PYG, model(family), case, family)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_full_layers_read_a_once_per_layer_source_table(variant, medium_graph, monkeypatch):
    """Every conv layer is gather-free and builds its source table once, not per batch;
    the second layer's input is freed once its table is derived, unless the conv reads
    it again (residual, separate destination weights); partial frontiers gather and still
    agree (``check_medium_graph``)."""
    built: list[int] = []
    real = GATAdapter._make_table

    def spy(self, x):
        built.append(int(x.shape[1]))
        return real(self, x)

    ev = LayerwiseEvaluator(model(variant), medium_graph[2], init_batch_nodes=97, progress=False)
    monkeypatch.setattr(GATAdapter, "_make_table", spy)  # after the load-time self-check
    ev.evaluate()
    layers = [ly for ly in ev.last_stats.layers if ly.layer > 0]
    assert all(ly.gather_free and ly.batches > 1 for ly in layers), layers
    hidden = 4 * VARIANTS[variant]["heads"] if VARIANTS[variant].get("concat", True) else 4
    assert built == [D_IN, hidden]  # one table per layer, from its whole input
    table_only = variant not in ("residual", "src-dst-weights")
    assert [ly.freed_inputs for ly in layers] == [0, int(table_only)]
    assert all(isinstance(a, GATAdapter) for a in ev.split.adapters.values())
    check_medium_graph(PYG, model(variant), medium_graph, variant)


def test_weight_updates_rebuild_the_table(medium_graph):
    edge_index, x, store = medium_graph
    m = model("heads3-concat")
    ev = LayerwiseEvaluator(m, store, init_batch_nodes=97, progress=False)
    ev.evaluate()
    with torch.no_grad():  # in place, as load_state_dict does
        for p in m.parameters():
            p.mul_(0.5)
    check_medium_graph(PYG, m, medium_graph, "updated weights")


class OwnMessage(GATConv):
    def message(self, x_j, alpha):
        return 2.0 * super().message(x_j, alpha)


class EdgeGAT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = GATConv(D_IN, 4, heads=2, edge_dim=3)

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, edge_attr)


def test_a_subclass_with_its_own_message_runs_its_forward(medium_graph):
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = OwnMessage(D_IN, 4, heads=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    ev = check_medium_graph(PYG, Net().eval(), medium_graph, "own message")
    ev.evaluate()
    assert not any(ly.gather_free for ly in ev.last_stats.layers)


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_other_aggregations_run_the_conv_forward(aggr, medium_graph):
    """``GATConv(aggr=...)`` other than a sum: its own forward on gathered rows (exact)."""
    torch.manual_seed(2)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GATConv(D_IN, 4, heads=2, aggr=aggr)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    ev = check_medium_graph(PYG, Net().eval(), medium_graph, f"aggr={aggr}")
    ev.evaluate()
    assert not any(ly.gather_free for ly in ev.last_stats.layers)


def test_edge_features_take_the_conv_forward():
    """A GAT given edge features runs its own forward on gathered rows (and is exact)."""
    from support import assert_exact, random_graph

    from hopserve import GraphStore

    edge_index, x, _ = random_graph(300, 2400, D_IN, seed=4, x_seed=5)
    edge_attr = torch.randn(edge_index.shape[1], 3, generator=torch.Generator().manual_seed(6))
    torch.manual_seed(1)
    m = EdgeGAT().eval()
    store = GraphStore.from_edge_index(edge_index, x, edge_attr=edge_attr)
    ev = LayerwiseEvaluator(m, store, init_batch_nodes=40, progress=False)
    with torch.no_grad():
        assert_exact(ev.evaluate(), m(x, edge_index, edge_attr), "gat edge_attr")
    assert not any(ly.gather_free for ly in ev.last_stats.layers)
