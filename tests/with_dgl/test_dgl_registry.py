"""DGL rows of the support matrix, registration of user DGL convs, and load refusals."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.function as fn  # noqa: E402
import dgl.nn as dglnn  # noqa: E402
from support import assert_exact, random_edge_index  # noqa: E402
from support.dgl_models import dgl_graph  # noqa: E402
from torch import nn  # noqa: E402

import hopserve  # noqa: E402
from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.worker.convs import adapter_for, support_matrix  # noqa: E402
from hopserve.worker.trace import ModelTraceError  # noqa: E402

pytestmark = pytest.mark.dgl


def test_support_matrix_has_dgl_rows_next_to_pyg_rows():
    matrix = support_matrix()
    assert matrix["dgl.GraphConv"][0] == "adapted"
    for name in ("SAGEConv", "GATConv", "GATv2Conv", "GINConv", "RelGraphConv"):
        assert matrix[f"dgl.{name}"][0] == "exact"
    for name in ("APPNPConv", "SGConv", "HeteroGraphConv"):
        assert matrix[f"dgl.{name}"][0] == "refused"
    if "GCNConv" in matrix:  # PyG installed too: its rows keep their bare names
        assert matrix["GraphConv"][0] == "exact"


def test_graphconv_adapter_for_subclass_via_mro():
    class MyConv(dglnn.GraphConv):
        pass

    assert type(adapter_for(MyConv(4, 4), "c")).__name__ == "DGLGraphConvAdapter"
    assert type(adapter_for(dglnn.SAGEConv(4, 4, "mean"), "c")).__name__ == "DGLConvAdapter"


class Hetero(nn.Module):
    """RGCN on a heterograph (DGL's RGCN example): per-relation GraphConvs."""

    def __init__(self):
        super().__init__()
        rels = ["follows", "buys"]
        self.conv1 = dglnn.HeteroGraphConv({r: dglnn.GraphConv(4, 8) for r in rels})
        self.conv2 = dglnn.HeteroGraphConv({r: dglnn.GraphConv(8, 2) for r in rels})

    def forward(self, g, inputs):
        h = self.conv1(g, inputs)
        h = {k: torch.relu(v) for k, v in h.items()}
        return self.conv2(g, h)


class WithRelGraphConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = dglnn.RelGraphConv(4, 4, num_rels=3)

    def forward(self, g, x):
        return self.conv(g, x, g.edata[dgl.ETYPE])


class WithSGC(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = dglnn.SGConv(4, 4, k=2)

    def forward(self, g, x):
        return self.conv(g, x)


@pytest.fixture(scope="module")
def store():
    n = 60
    ei = random_edge_index(n, 300, seed=2)
    return ei, torch.randn(n, 4), GraphStore.from_edge_index(ei, torch.randn(n, 4))


def test_a_heterograph_model_on_an_untyped_store_is_refused(store):
    *_, st = store
    with pytest.raises(
        ModelTraceError, match="takes per-type dicts, but the graph has no node types"
    ):
        LayerwiseEvaluator(Hetero(), st)


def test_refusals_name_the_conv_and_reason(store):
    *_, st = store
    with pytest.raises(ModelTraceError, match=r"SGConv.*k hops"):
        LayerwiseEvaluator(WithSGC(), st)
    # RelGraphConv reads edge types from the graph outside the conv: refused there.
    with pytest.raises(ModelTraceError, match="used outside a conv"):
        LayerwiseEvaluator(WithRelGraphConv(), st)


class ScaledSum(nn.Module):
    """A user DGL conv: 2 · sum of in-neighbours, then a linear map."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, graph, feat):
        with graph.local_scope():
            src = feat[0] if isinstance(feat, tuple) else feat
            graph.srcdata["h"] = 2 * src
            graph.update_all(fn.copy_u("h", "m"), fn.sum("m", "s"))
            return self.lin(graph.dstdata["s"])


class UsesScaledSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = ScaledSum(4, 8), ScaledSum(8, 3)

    def forward(self, g, x):
        return self.c2(g, self.c1(g, x).relu())


def test_registered_user_dgl_conv_runs_exactly(store):
    ei, x, _ = store
    st = GraphStore.from_edge_index(ei, x)
    model = UsesScaledSum().eval()
    # Not a dgl.nn class, so its module is inlined and the graph reaches DGL calls.
    with pytest.raises(ModelTraceError):
        LayerwiseEvaluator(model, st)
    hopserve.register_conv(ScaledSum)  # DGL-style forward(graph, feat): a DGL adapter
    ev = LayerwiseEvaluator(model, st, init_batch_nodes=9, progress=False)
    with torch.no_grad():
        assert_exact(ev.evaluate(), model(dgl_graph(ei, x.shape[0]), x), "registered DGL conv")


def test_a_dgl_model_never_imports_pyg():
    """PyG's rows load only once ``torch_geometric`` is imported (a model holding a PyG
    module has imported it): a DGL-only worker does not pay for importing PyG."""
    import subprocess
    import sys

    code = """
import sys, torch, dgl.nn as dglnn
from torch import nn
from hopserve import GraphStore, LayerwiseEvaluator
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = dglnn.GraphConv(4, 8, allow_zero_in_degree=True)
        self.c2 = dglnn.SAGEConv(8, 3, "mean")
    def forward(self, g, x):
        return self.c2(g, self.c1(g, x).relu())
torch.manual_seed(0)  # a fixed graph (nodes without in-edges are allowed either way)
store = GraphStore.from_edge_index(torch.randint(0, 50, (2, 300)), torch.randn(50, 4))
LayerwiseEvaluator(M().eval(), store, progress=False).evaluate()
assert "torch_geometric" not in sys.modules, "PyG was imported"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_dgl_dict_model_never_imports_pyg():
    """A DGL dict model (the rgcn-hetero example layer on a typed store) is rebuilt and
    served without importing PyG either (its ``HeteroConv`` is looked for only when PyG is
    imported): about 66 MB less in a DGL worker."""
    import subprocess
    import sys

    code = """
import sys, torch, dgl
from torch import nn
from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.testing.dgl_rgcn_hetero import RelGraphConvLayer
g = dgl.heterograph({
    ("user", "clicks", "item"): (torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1])),
    ("item", "clicked_by", "user"): (torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2])),
})
for t in g.ntypes:
    g.nodes[t].data["feat"] = torch.randn(g.num_nodes(t), 4)
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = RelGraphConvLayer(4, 3, ["clicked_by", "clicks"], 1, self_loop=True)
    def forward(self, g, x):
        return self.layer(g, x)
LayerwiseEvaluator(M().eval(), GraphStore.from_dgl(g), progress=False).evaluate()
assert "torch_geometric" not in sys.modules, "PyG was imported"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
