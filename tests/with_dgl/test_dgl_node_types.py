"""DGL models taking node type ids (``forward(g, x, ntype, etype)`` calling ``HGTConv(g, h,
ntype, etype)``, as DGL's HGT example runs it on ``dgl.to_homogeneous``) served from a
typed store: node type ids from its node types, relation ids from its ``edge_type``
column; equal to their own full-graph forward on ``to_homogeneous``, full and partial,
batched with the load-time self-check."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

import dgl.nn.pytorch as dglnn  # noqa: E402
from support import assert_exact  # noqa: E402
from torch import nn  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.worker.convs import edge_chunks  # noqa: E402
from hopserve.worker.convs.dgl_conv import DGLConvAdapter  # noqa: E402
from hopserve.worker.convs.dgl_hgt import DGLHGTAdapter  # noqa: E402
from hopserve.worker.engine.nodewise import NodewiseEvaluator  # noqa: E402
from hopserve.worker.trace.tracer import ModelTraceError  # noqa: E402

pytestmark = pytest.mark.dgl

D_IN = 8
RELATIONS = [
    ("user", "clicks", "item"),
    ("item", "clicked-by", "user"),
    ("user", "follows", "user"),
    ("item", "in", "category"),
]


class HGT(nn.Module):
    """DGL's HGT example: two ``HGTConv`` layers over node and relation type ids; the
    second changes the width (its skip goes through ``residual_w``)."""

    def __init__(self, num_ntypes: int, num_etypes: int, use_norm: bool = False) -> None:
        super().__init__()
        self.conv1 = dglnn.HGTConv(D_IN, 4, 2, num_ntypes, num_etypes, use_norm=use_norm)
        self.conv2 = dglnn.HGTConv(8, 3, 2, num_ntypes, num_etypes, use_norm=use_norm)

    def forward(self, g, x, ntype, etype):
        h = self.conv1(g, x, ntype, etype).relu()
        return self.conv2(g, h, ntype, etype)


def heterograph(seed: int):
    """Users, items and categories (categories have no out-edges, users no category
    edges; some nodes have no in-edges), duplicate edges included."""
    gen = torch.Generator().manual_seed(seed)
    counts = {"user": 60, "item": 45, "category": 7}
    data = {}
    for s, r, d in RELATIONS:
        e = 150
        src = torch.randint(0, counts[s], (e,), generator=gen)
        dst = torch.randint(0, counts[d] - 2, (e,), generator=gen)  # the last two: no in-edge
        data[(s, r, d)] = (torch.cat([src, src[:5]]), torch.cat([dst, dst[:5]]))
    hg = dgl.heterograph(data, num_nodes_dict=counts)
    for t, n in counts.items():
        hg.nodes[t].data["feat"] = torch.randn(n, D_IN, generator=gen)
    return hg


def reference(model: nn.Module, hg) -> torch.Tensor:
    """The model's own forward on ``to_homogeneous`` (rows in its node order)."""
    g = dgl.to_homogeneous(hg, ndata=["feat"])
    with torch.no_grad():
        return model(g, g.ndata["feat"], g.ndata[dgl.NTYPE], g.edata[dgl.ETYPE])


@pytest.mark.parametrize("chunks", ["default", "one edge", "keys per chunk"])
@pytest.mark.parametrize("use_norm", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_hgtconv_equals_its_full_graph_forward(seed, use_norm, chunks, monkeypatch):
    """Full and partial; with one edge per chunk too (:mod:`~.edge_chunks`: every chunk
    boundary of the scores and the weighted sums crossed), and with keys and values
    projected per chunk of edges (a hub's batch) instead of tables."""
    if chunks == "one edge":
        monkeypatch.setattr(edge_chunks, "EDGE_CHUNK_BYTES", 1)
    if chunks == "keys per chunk":
        monkeypatch.setattr(edge_chunks, "KV_TABLE_BYTES", 0)
        tables = []
        keys_values = DGLHGTAdapter._keys_values
        monkeypatch.setattr(
            DGLHGTAdapter, "_keys_values", lambda *a: tables.append(1) or keys_values(*a)
        )
    hg = heterograph(seed)
    torch.manual_seed(seed)
    model = HGT(len(hg.ntypes), len(hg.etypes), use_norm).eval()
    want = reference(model, hg)
    store = GraphStore.from_dgl(hg)
    assert [t.name for t in store.node_types] == hg.ntypes
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=13, progress=False)  # self-check on
    assert {type(a) for a in ev.split.adapters.values()} == {DGLHGTAdapter}
    assert_exact(ev.evaluate(), want, f"hgt seed={seed} full")
    assert ev.last_stats.batches > ev.num_layers
    n = want.shape[0]
    targets = torch.tensor([n - 1, 0, 61, 61, 100, n - 2])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"hgt seed={seed} partial")
    if chunks == "keys per chunk":
        assert not tables  # no batch made a key/value table
    with torch.no_grad():  # the test can fail: other node type ids give other rows
        g = dgl.to_homogeneous(hg, ndata=["feat"])
        other = model(g, g.ndata["feat"], (g.ndata[dgl.NTYPE] + 1) % 3, g.edata[dgl.ETYPE])
    assert (other - want).abs().max() > 1e-2


class OwnHGTConv(dglnn.HGTConv):
    """A user's ``HGTConv`` with its own forward (the parent's, halved)."""

    def forward(self, g, x, ntype, etype, *, presorted=False):
        return 0.5 * super().forward(g, x, ntype, etype, presorted=presorted)


def test_an_hgtconv_with_its_own_forward_runs_it_on_each_block():
    hg = heterograph(3)
    torch.manual_seed(0)
    model = HGT(len(hg.ntypes), len(hg.etypes)).eval()
    for name in ("conv1", "conv2"):
        own = OwnHGTConv(D_IN if name == "conv1" else 8, 4 if name == "conv1" else 3, 2, 3, 4)
        setattr(model, name, own.eval())
    want = reference(model, hg)
    ev = LayerwiseEvaluator(model, GraphStore.from_dgl(hg), init_batch_nodes=13, progress=False)
    assert {type(a) for a in ev.split.adapters.values()} == {DGLConvAdapter}
    assert_exact(ev.evaluate(), want, "own hgt full")
    targets = torch.tensor([0, 61, 100, 100])
    assert_exact(ev.evaluate(targets=targets), want[targets], "own hgt partial")


def test_hgtconv_through_the_nodewise_fallback():
    hg = heterograph(2)
    torch.manual_seed(0)
    model = HGT(len(hg.ntypes), len(hg.etypes)).eval()
    want = reference(model, hg)
    ev = NodewiseEvaluator(model, GraphStore.from_dgl(hg), hops=2, batch_size=7)
    targets = torch.tensor([0, 5, 59, 60, 104, 111])
    assert_exact(ev.evaluate(targets=targets), want[targets], "hgt node-wise")


def test_an_untyped_store_is_refused_naming_the_argument():
    hg = heterograph(0)
    g = dgl.to_homogeneous(hg, ndata=["feat"])
    store = GraphStore.from_dgl(g, relations=list(hg.etypes))  # relation ids, no node types
    model = HGT(len(hg.ntypes), len(hg.etypes)).eval()
    with pytest.raises(ModelTraceError, match="node type ids 'ntype'.*untyped"):
        LayerwiseEvaluator(model, store, progress=False)


def test_more_node_types_than_the_model_knows_are_refused():
    hg = heterograph(0)
    model = HGT(len(hg.ntypes) - 1, len(hg.etypes)).eval()
    with pytest.raises(ModelTraceError, match="3 node types .* has weights for 2"):
        LayerwiseEvaluator(model, GraphStore.from_dgl(hg), progress=False)


def test_a_heterograph_with_per_etype_edge_features_fills_the_store_edge_column():
    """Each edge type's ``edata['feat']`` lands on its edges: the store's (source,
    destination, relation, features) rows are ``dgl.to_homogeneous``'s."""
    hg = heterograph(4)
    gen = torch.Generator().manual_seed(9)
    for c in hg.canonical_etypes:
        hg.edges[c].data["feat"] = torch.randn(hg.num_edges(c), 2, generator=gen)
    store = GraphStore.from_dgl(hg)
    homo = dgl.to_homogeneous(hg, ndata=["feat"], edata=["feat"])
    src, dst = homo.edges()

    def rows(s, d, t, f):
        return sorted(zip(s.tolist(), d.tolist(), t.tolist(), map(tuple, f.tolist()), strict=True))

    ext = store.to_external(store.edge_index())
    got = rows(ext[0], ext[1], store.edge_type, store.edge_features)
    assert got == rows(src, dst, homo.edata[dgl.ETYPE], homo.edata["feat"])
    del hg.edges[RELATIONS[1]].data["feat"]
    with pytest.raises(ValueError, match="edge_attr_dict has no rows for relation"):
        GraphStore.from_dgl(hg)
    assert GraphStore.from_dgl(hg, edge_feature_key=None).edge_features is None
