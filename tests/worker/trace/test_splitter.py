"""DGI's partition rules: layer indexing, minimum input, upstream binding; the schema."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact, random_edge_index
from support.models import JKNet, TwoConvsOneLayer, WeightShared, build
from torch import nn
from torch_geometric.nn import SAGEConv

from hopserve import GraphStore, LayerwiseEvaluator, make_evaluator
from hopserve.worker.trace import split_model
from hopserve.worker.trace.blocks import FEATURES


def test_layer_indexing_groups_same_layer_convs_sharing_input():
    split = split_model(TwoConvsOneLayer(4), feature_dim=4)
    layers = {b.index: b for b in split.blocks}
    assert sorted(layers[2].convs) == ["left", "right"]
    assert len(layers[2].inputs) == 1  # both convs read one loaded tensor
    assert layers[2].inputs[0].rows == "src"


def test_weight_shared_conv_runs_at_every_layer():
    split = split_model(WeightShared(4), feature_dim=4)
    assert [b.convs for b in split.blocks if b.index > 0] == [["conv"], ["conv"], ["conv"]]
    assert list(split.adapters) == ["conv"]  # one adapter for the shared module


class ChainWithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = SAGEConv(4, 8), SAGEConv(8, 3)

    def forward(self, x, edge_index):
        h = torch.relu(self.c1(x, edge_index))
        h = nn.functional.dropout(h, 0.3, training=self.training)
        return self.c2(h, edge_index)


def test_upstream_binding_keeps_normal_ops_in_the_producing_block():
    split = split_model(ChainWithDropout(), feature_dim=4)
    b1, b2 = split.blocks
    assert b1.outputs == ["dropout"]  # relu and dropout ran once per node, in block 1
    assert [i.name for i in b2.inputs] == ["dropout"]


class MinimumInput(nn.Module):
    """Figure 5(b): two ops after conv1 feed two layer-2 convs."""

    def __init__(self):
        super().__init__()
        self.c1 = SAGEConv(4, 8)
        self.norm = nn.LayerNorm(8)
        self.c2, self.c3 = SAGEConv(8, 3), SAGEConv(8, 3)

    def forward(self, x, edge_index):
        a = torch.relu(self.c1(x, edge_index))
        b = self.norm(a)
        return self.c2(a, edge_index) + self.c3(b, edge_index)


def test_minimum_input_moves_ops_downstream_when_it_saves_a_transfer():
    split = split_model(MinimumInput(), feature_dim=4)
    b2 = split.blocks[-1]
    assert [i.name for i in b2.inputs] == ["relu"]  # not relu and norm
    assert b2.inputs[0].rows == "src"
    n = 80
    edge_index = random_edge_index(n, 400)
    x = torch.randn(n, 4)
    model = MinimumInput().eval()
    ev = LayerwiseEvaluator(model, GraphStore.from_edge_index(edge_index, x), init_batch_nodes=7)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(x, edge_index), "minimum input")


def test_jknet_schema_reads_earlier_layers_and_frees_them():
    split = split_model(JKNet(4, mode="cat"), feature_dim=4)
    assert [b.index for b in split.blocks] == [0, 1, 2, 3]
    b0, b1, b2, b3 = split.blocks
    assert b0.inputs[0].producer == FEATURES and b0.convs == []
    producers = sorted(i.producer for i in b3.inputs)
    assert producers == [
        1,
        2,
    ]  # layer-1 output; layer-2 output once (src rows, sliced for the residual)
    # every stored value is freed after the last block that reads it
    for b in split.blocks[:-1]:
        for name in b.outputs:
            readers = [c.index for c in split.blocks if any(i.name == name for i in c.inputs)]
            assert split.last_use[name] == max(readers)


def test_describe_lists_every_block():
    split = split_model(build("jk_lstm", 4), feature_dim=4)
    text = split.describe()
    assert text.count("block ") == len(split.blocks)


def test_feature_width_mismatch_names_both_widths_and_the_layer():
    """Regression: a graph whose features are narrower than the model's first layer gave
    a bare matmul error; the fallback must not hide it either."""
    from hopserve.examples import GCN
    from hopserve.worker.trace import FeatureWidthError

    store = GraphStore.from_edge_index(random_edge_index(30, 90), torch.randn(30, 1000))
    for fallback in ("error", "nodewise"):
        with pytest.raises(FeatureWidthError) as info:
            make_evaluator(GCN(1433, 16, 7), store, fallback=fallback)
        assert str(info.value).startswith(
            "graph has 1000-dim features, model's first layer 'conv1' (GCNConv) expects 1433"
        )
