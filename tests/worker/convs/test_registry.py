"""The support matrix, user registration, and per-conv refusals."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_edge_index
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing, SAGEConv

import hopserve
from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.convs import UnsupportedConvError, adapter_for, support_matrix


def test_support_matrix_lists_exact_adapted_and_refused():
    matrix = support_matrix()
    assert matrix["SAGEConv"][0] == "exact"
    assert matrix["GCNConv"][0] == "adapted"
    assert matrix["APPNP"][0] == "refused"


class ScaledSum(MessagePassing):
    """A user conv: sum of 2·x_j over in-neighbours plus a root term."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__(aggr="add")
        self.lin = nn.Linear(d_in, d_out)
        self.root = nn.Linear(d_in, d_out)

    def forward(self, x, edge_index):
        if isinstance(x, torch.Tensor):
            x = (x, x)
        return self.propagate(edge_index, x=x) + self.root(x[1])

    def message(self, x_j):
        return 2 * self.lin(x_j)


class UsesScaledSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = ScaledSum(4, 8), ScaledSum(8, 3)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


def test_registered_user_conv_runs_exactly():
    n = 70
    edge_index = random_edge_index(n, 350)
    x = torch.randn(n, 4)
    store = GraphStore.from_edge_index(edge_index, x)
    model = UsesScaledSum().eval()
    with pytest.raises(Exception, match="support matrix"):
        LayerwiseEvaluator(model, store)
    hopserve.register_conv(ScaledSum)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=9)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "registered conv")


def test_target_to_source_flow_refused():
    conv = SAGEConv(4, 4, flow="target_to_source")
    with pytest.raises(UnsupportedConvError, match="flow"):
        adapter_for(conv, "conv")


def test_gcn_adapter_for_subclass_via_mro():
    class MyGCN(GCNConv):
        pass

    adapter = adapter_for(MyGCN(4, 4), "conv")
    assert type(adapter).__name__ == "GCNAdapter"


def test_registering_a_conv_that_takes_one_tensor_runs_it_square(monkeypatch):
    """``register_conv(PNAConv)`` (a user re-registering it) must not hand it a pair: its
    forward annotates ``x: Tensor``, so it runs on the square batch, exactly."""
    from torch_geometric.nn import PNAConv

    from hopserve.worker.convs import registry

    registry._load_builtins()
    monkeypatch.setattr(registry, "_MATRIX", dict(registry._MATRIX))  # restored afterwards
    hopserve.register_conv(PNAConv)
    conv = PNAConv(4, 3, ["mean", "max", "std"], ["identity", "amplification"], torch.ones(5))
    assert adapter_for(conv, "conv").pair is False
    n = 60
    edge_index = random_edge_index(n, 240, seed=3)
    x = torch.randn(n, 4)
    store = GraphStore.from_edge_index(edge_index, x)

    class OnePNA(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    model = OnePNA().eval()
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=7, progress=False)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "registered PNAConv")


def test_a_registration_made_before_the_builtins_load_is_kept():
    """``register_conv`` of a class the matrix refuses, in a fresh process before anything
    loaded PyG's rows: the user's entry wins when they load."""
    import subprocess
    import sys

    code = """
import torch_geometric.nn as pyg
import hopserve
from hopserve.worker.convs import adapter_for, support_matrix
hopserve.register_conv(pyg.LEConv, note="mine")
adapter_for(pyg.LEConv(4, 4), "conv")  # loads the builtin rows; not refused
assert support_matrix()["LEConv"] == ("exact", "mine"), support_matrix()["LEConv"]
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
