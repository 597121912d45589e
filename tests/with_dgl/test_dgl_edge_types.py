"""DGL models taking relation ids (``forward(g, x, etype)`` calling ``RelGraphConv(g, h,
etypes)``) served from the graph store's ``edge_type`` column equal their own full-graph
forward, full and partial, batched with the load-time self-check; ``from_dgl`` takes the
relation ids of ``dgl.to_homogeneous`` (``edata[dgl.ETYPE]``) with the relation names."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.nn.pytorch as dglnn  # noqa: E402
from support import assert_exact, random_edge_index  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.worker.trace.tracer import ModelTraceError  # noqa: E402

pytestmark = pytest.mark.dgl

D_IN, R, N = 6, 3, 400


class RGCN(nn.Module):
    """DGL's RGCN example: two ``RelGraphConv`` layers over relation ids."""

    def __init__(self, regularizer: str | None = None) -> None:
        super().__init__()
        kw = {"regularizer": regularizer, "num_bases": 2} if regularizer else {}
        self.conv1 = dglnn.RelGraphConv(D_IN, 8, R, self_loop=True, **kw)
        self.conv2 = dglnn.RelGraphConv(8, 4, R, self_loop=True, **kw)

    def forward(self, g, x, etype):
        h = self.conv1(g, x, etype).relu()
        return self.conv2(g, h, etype)


@pytest.fixture(scope="module")
def graph():
    ei = random_edge_index(N, 2400, seed=1)
    ei = torch.cat([ei, ei[:, :40]], dim=1)  # the same (src, dst) again, another relation
    x = torch.randn(N, D_IN, generator=torch.Generator().manual_seed(2))
    et = torch.randint(0, R, (ei.shape[1],), generator=torch.Generator().manual_seed(3))
    return ei, x, et


@pytest.mark.parametrize("regularizer", [None, "basis", "bdd"])
def test_relgraphconv_equals_its_full_graph_forward(graph, regularizer):
    ei, x, et = graph
    torch.manual_seed(0)
    model = RGCN(regularizer).eval()
    with torch.no_grad():
        want = model(dgl.graph((ei[0], ei[1]), num_nodes=N), x, et)
    store = GraphStore.from_edge_index(ei, x, edge_type=et)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=29, progress=False)  # self-check on
    assert_exact(ev.evaluate(), want, f"rgcn {regularizer} full")
    assert ev.last_stats.batches > ev.num_layers
    targets = torch.tensor([N - 1, 0, 17, 17, 200])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"rgcn {regularizer} partial")
    with torch.no_grad():  # the test can fail: other relation ids give other rows
        other = model(dgl.graph((ei[0], ei[1]), num_nodes=N), x, (et + 1) % R)
    assert (other - want).abs().max() > 1e-2


def test_from_dgl_takes_to_homogeneous_relation_ids():
    hg = dgl.heterograph(
        {
            ("user", "clicks", "item"): ([0, 1, 2], [0, 0, 1]),
            ("item", "clicked-by", "user"): ([0, 0, 1], [0, 1, 2]),
            ("user", "follows", "user"): ([0, 1], [1, 2]),
        }
    )
    hg.nodes["user"].data["feat"] = torch.randn(3, 4)
    hg.nodes["item"].data["feat"] = torch.randn(2, 4)
    g = dgl.to_homogeneous(hg, ndata=["feat"])
    store = GraphStore.from_dgl(g, relations=list(hg.etypes))
    assert store.relations == hg.etypes == ["clicked-by", "clicks", "follows"]
    src, dst = g.edges()
    want = Counter(zip(src.tolist(), dst.tolist(), g.edata[dgl.ETYPE].tolist(), strict=True))
    ext = store.to_external(store.edge_index())
    got = Counter(zip(ext[0].tolist(), ext[1].tolist(), store.edge_type.tolist(), strict=True))
    assert got == want
    assert GraphStore.from_dgl(g, edge_type_key=None).edge_type is None


def test_a_graph_without_relation_ids_is_refused_naming_the_argument(graph):
    ei, x, _ = graph
    with pytest.raises(ModelTraceError, match="edge data 'etype'"):
        LayerwiseEvaluator(RGCN().eval(), GraphStore.from_edge_index(ei, x), progress=False)


def test_a_heterograph_becomes_a_typed_store_equal_to_its_to_homogeneous():
    hg = dgl.heterograph(
        {
            ("user", "clicks", "item"): ([0, 1, 2, 2], [0, 0, 1, 2]),
            ("item", "clicked-by", "user"): ([0, 0, 1, 2], [0, 1, 2, 2]),
            ("user", "follows", "user"): ([0, 1], [1, 2]),
        }
    )
    hg.nodes["user"].data["feat"] = torch.randn(3, 4)
    hg.nodes["item"].data["feat"] = torch.randn(3, 4)
    store = GraphStore.from_dgl(hg)
    homo = dgl.to_homogeneous(hg, ndata=["feat"])
    assert [t.name for t in store.node_types] == hg.ntypes
    assert store.relations == ["__".join(c) for c in hg.canonical_etypes]
    order = store.sorted_external_order()
    assert torch.equal(store.features[order], homo.ndata["feat"])
    src, dst = homo.edges()
    want = Counter(zip(src.tolist(), dst.tolist(), homo.edata[dgl.ETYPE].tolist(), strict=True))
    ext = store.to_external(store.edge_index())
    got = Counter(zip(ext[0].tolist(), ext[1].tolist(), store.edge_type.tolist(), strict=True))
    assert got == want
