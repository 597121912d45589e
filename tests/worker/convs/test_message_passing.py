"""1-hop PyG convs through :class:`MessagePassingAdapter` beyond the engine's model families:
pair convs and square convs (one tensor in: ``PNAConv``, ``AGNNConv``, ``ClusterGCNConv``,
``SuperGATConv``) are exact in many batches, and their per-destination statistics
(in-degrees, softmaxes) follow the sampled graph under sampling evaluation.
"""

from __future__ import annotations

import pytest
from support import conv_audit as audit
from support.exactness import PYG, check_medium_graph
from support.sampling import check_medium_graph as check_medium_sampled

from hopserve.worker.convs.message_passing import MessagePassingAdapter

SQUARE = ["PNAConv", "AGNNConv", "ClusterGCNConv", "SuperGATConv"]
PAIR = ["MFConv", "GENConv", "ResGatedGraphConv", "LEConv", "FeaStConv", "GeneralConv"]
PAIR += ["CGConv", "FiLMConv", "WLConvContinuous", "SimpleConv"]


def model_of(name: str, seed: int = 3):
    return audit.build_model("pyg", audit.pyg_classes()[name], audit.PYG_CASES[name][0], seed)


@pytest.mark.parametrize("name", SQUARE + PAIR)
def test_medium_graph_many_batches(name, medium_graph):
    ev = check_medium_graph(PYG, model_of(name), medium_graph, name)
    adapters = list(ev.split.adapters.values())
    assert all(isinstance(a, MessagePassingAdapter) for a in adapters)
    assert all(a.pair is (name not in SQUARE) for a in adapters)


@pytest.mark.parametrize("name", SQUARE + ["MFConv", "GENConv"])
def test_medium_graph_sampled(name, medium_graph):
    check_medium_sampled(PYG, model_of(name), medium_graph, [([3, 2], 7), ([-1, 1], 0)], name)
