"""The node-wise fallback: slow but exact for models the layer-wise engine refuses."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_graph
from support.models import LinAPPNP, OneConv, build
from torch import nn
from torch_geometric.nn import SGConv

from hopserve import LayerwiseEvaluator, NodewiseEvaluator, make_evaluator
from hopserve.worker.trace import ModelTraceError


class APPNPNet(LinAPPNP):
    def __init__(self):
        super().__init__(nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3)), k=4)


class SGC(OneConv):
    def __init__(self):
        super().__init__(SGConv(5, 3, K=2))


class Branchy(nn.Module):
    """Untraceable (data-dependent branch), so its receptive field must be given."""

    def __init__(self):
        super().__init__()
        self.inner = build("sage_mean", 5)

    def forward(self, x, edge_index):
        if x.abs().sum() >= 0:
            return self.inner(x, edge_index)
        return x


@pytest.fixture(scope="module")
def graph():
    return random_graph(250, 1200, 5, seed=8, x_seed=9)


@pytest.mark.parametrize("model_cls", [APPNPNet, SGC])
def test_fallback_is_exact_for_refused_models(graph, model_cls):
    edge_index, x, store = graph
    model = model_cls().eval()
    with pytest.raises(ModelTraceError):
        LayerwiseEvaluator(model, store)
    ev = make_evaluator(model, store, fallback="nodewise")
    assert ev.mode == "nodewise"
    with torch.no_grad():
        want = model(x, edge_index)
    ids = torch.tensor([0, 249, 13, 13])
    assert_exact(ev.evaluate(targets=ids), want[ids], model_cls.__name__)
    assert_exact(ev.evaluate(), want, model_cls.__name__ + " all")


def test_hops_inferred_from_k_hop_convs():
    assert NodewiseEvaluator.__init__  # import check
    from hopserve.worker.engine.nodewise import infer_hops

    assert infer_hops(APPNPNet()) == 4
    assert infer_hops(build("sage_mean", 5)) == 3


def test_untraceable_model_needs_hops(graph):
    edge_index, x, store = graph
    model = Branchy().eval()
    with pytest.raises(ValueError, match="hops"):
        make_evaluator(model, store, fallback="nodewise")
    ev = make_evaluator(model, store, fallback="nodewise", hops=3)
    ids = torch.tensor([3, 100])
    with torch.no_grad():
        assert_exact(ev.evaluate(targets=ids), model(x, edge_index)[ids], "branchy")


def test_nodewise_baseline_matches_layerwise(graph):
    edge_index, x, store = graph
    model = build("gcn", 5)
    ids = torch.tensor([7, 8, 200])
    a = NodewiseEvaluator(model, store, batch_size=2).evaluate(ids)
    b = LayerwiseEvaluator(model, store).evaluate(ids)
    assert_exact(a, b, "node-wise vs layer-wise")
