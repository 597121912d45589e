"""DGL convs with a second per-node input: ``GCN2Conv`` (``feat_0`` on destination rows,
whole-graph in-degree norms) and ``EGNNConv`` (coordinates in, coordinates out). Each equals
the model's own forward in many batches, on random graphs and sampled (``G_l``'s degrees).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from dgl.nn.pytorch import EGNNConv, GCN2Conv  # noqa: E402
from support import sampling  # noqa: E402
from support.dgl_models import DGL  # noqa: E402
from support.exactness import (  # noqa: E402
    D_IN,
    check_medium_graph,
    check_random_graph,
    family_cases,
    graphs,
)

from hopserve.worker.trace import ModelTraceError, split_model  # noqa: E402

pytestmark = pytest.mark.dgl


class DGLGCNII(nn.Module):
    """GCNII as DGL's example writes it: ``x_0 = relu(fc_in(x))``, GCN2Convs reading
    ``x_0`` (``layer=i+1``), then ``fc_out``."""

    def __init__(self, layers: int = 3, hidden: int = 8, project: bool = True) -> None:
        super().__init__()
        self.fc_in = nn.Linear(D_IN, hidden)
        self.convs = nn.ModuleList(
            GCN2Conv(
                hidden,
                layer=i + 1,
                alpha=0.2,
                lambda_=0.7,
                project_initial_features=project,
                allow_zero_in_degree=True,
            )
            for i in range(layers)
        )
        self.fc_out = nn.Linear(hidden, 3)

    def forward(self, g, x):
        h = x_0 = self.fc_in(x).relu()
        for conv in self.convs:
            h = conv(g, h, x_0).relu()
        return self.fc_out(h)


class DGLEGNN(nn.Module):
    """Two EGNN layers: coordinates start as the features' first 3 columns and each layer
    updates them (``h, pos = conv(g, h, pos)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in = nn.Linear(D_IN, 8)
        self.conv1, self.conv2 = EGNNConv(8, 8, 8), EGNNConv(8, 8, 4)

    def forward(self, g, x):
        h, pos = self.conv1(g, self.fc_in(x), x[:, :3])
        h, pos = self.conv2(g, h.relu(), pos)
        return torch.cat([h, pos], dim=1)


def _model(family: str) -> nn.Module:
    torch.manual_seed(4)
    if family == "egnn":
        return DGLEGNN().eval()
    return DGLGCNII(project=family == "gcnii").eval()


FAMILIES = ["gcnii", "gcnii-two-weights", "egnn"]


@pytest.mark.parametrize("family", FAMILIES)
def test_medium_graph_many_batches(family, medium_graph):
    check_medium_graph(DGL, _model(family), medium_graph, family)


@family_cases(FAMILIES, 20, graphs())
def test_random_graphs(family, case):
    check_random_graph(DGL, _model(family), case, family)


@pytest.mark.parametrize("family", ["gcnii", "egnn"])
def test_medium_graph_sampled(family, medium_graph):
    """GCN2Conv's norms use G_l's in-degrees (min(d, f)) for sources and destinations."""
    runs = [([3, 2, 2], 7), ([-1, 1, 4], 0)] if family == "gcnii" else [([3, 2], 7)]
    sampling.check_medium_graph(DGL, _model(family), medium_graph, runs, family)


def test_feat_0_is_read_on_destination_rows_only():
    split = split_model(_model("gcnii"), D_IN)
    for block in split.blocks[2:]:
        reads = {i.name: i.rows for i in block.inputs if i.producer == 0}
        assert reads and set(reads.values()) == {"dst"}, split.describe()


class RawFeaturesX0(nn.Module):
    """``feat_0`` is the feature input itself, from the store, read on destination rows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCN2Conv(D_IN, layer=1, alpha=0.3, allow_zero_in_degree=True)
        self.conv2 = GCN2Conv(D_IN, layer=2, alpha=0.3, allow_zero_in_degree=True)

    def forward(self, g, x):
        return self.conv2(g, self.conv1(g, x, x).relu(), x)


def test_raw_features_as_feat_0(medium_graph):
    torch.manual_seed(6)
    check_medium_graph(DGL, RawFeaturesX0().eval(), medium_graph, "raw feat_0")


class OwnForward(GCN2Conv):
    def forward(self, graph, feat, feat_0, edge_weight=None):
        return 2 * super().forward(graph, feat, feat_0, edge_weight)


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = OwnForward(D_IN, layer=1)

    def forward(self, g, x):
        return self.conv(g, x, x)


def test_a_subclass_with_its_own_forward_is_refused():
    with pytest.raises(ModelTraceError, match="subclass of GCN2Conv overriding forward"):
        split_model(Wrapped().eval(), D_IN)
