"""Typed node sets: a store with node types as storage-id ranges (format version 3).

Built from ``HeteroData`` (``FakeHeteroDataset``) and from dicts, the store's homogeneous
form is PyG's ``HeteroData.to_homogeneous()`` (store-wide external IDs, relation ids,
features); RCMK keeps every type in its range; per-type lookups; save and reopen; bad
relations and endpoints are refused naming them; the typed synthetic graphs are
deterministic with informative labels; an RGCN on a typed store equals its own forward.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_exact

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.graph import GraphFormatError
from hopserve.worker.graph.errors import UnknownNodeError
from hopserve.worker.graph.synth_hetero import fraud_graph, recommender_graph, synth_recommender


def _homogeneous(store: GraphStore) -> tuple[torch.Tensor, Counter]:
    """Features by store-wide external ID, and the multiset of typed edges in those IDs."""
    order = store.sorted_external_order()
    ext = store.to_external(store.edge_index())
    edges = Counter(zip(ext[0].tolist(), ext[1].tolist(), store.edge_type.tolist(), strict=True))
    return store.features[order], edges


def _fake_hetero(seed: int = 0):
    from torch_geometric.datasets import FakeHeteroDataset

    torch.manual_seed(seed)
    return FakeHeteroDataset(num_graphs=1, num_node_types=3, num_edge_types=5, avg_num_nodes=40,
                             avg_degree=4, num_classes=3)[0]  # fmt: skip


@pytest.mark.parametrize("reorder", ["rcmk", None])
def test_hetero_data_store_is_its_to_homogeneous(reorder):
    data = _fake_hetero()
    store = GraphStore.from_pyg(data, reorder=reorder)
    homo = data.to_homogeneous()
    assert store.meta.format_version == 3
    assert [t.name for t in store.node_types] == list(data.node_types)
    assert [t.count for t in store.node_types] == [data[t].num_nodes for t in data.node_types]
    assert store.relations == ["__".join(e) for e in data.edge_types]
    x, edges = _homogeneous(store)
    assert torch.equal(x, homo.x)
    want = Counter(zip(homo.edge_index[0].tolist(), homo.edge_index[1].tolist(),
                       homo.edge_type.tolist(), strict=True))  # fmt: skip
    assert edges == want
    for t in store.node_types:  # every type keeps its range: ids of its nodes
        ext = store.to_external(torch.arange(t.offset, t.offset + t.count))
        assert sorted(ext.tolist()) == list(range(t.offset, t.offset + t.count))
    labelled = data.node_types[0]
    got = store.labels[store.topology.typed_storage(np.arange(5), labelled)]
    assert torch.equal(got, data[labelled].y[:5])


@settings(max_examples=20, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    e=st.integers(0, 60),
    seed=st.integers(0, 1000),
)
def test_rcmk_keeps_every_type_in_its_range(counts, e, seed):
    counts[0] = max(counts[0], 1)
    names = [f"t{k}" for k in range(len(counts))]
    rng = np.random.default_rng(seed)
    x_dict = {t: torch.randn(c, 3) for t, c in zip(names, counts, strict=True)}
    edges = {}
    for r in range(3):
        s, d = (names[int(v)] for v in rng.integers(0, len(names), 2))
        if counts[names.index(s)] and counts[names.index(d)]:
            ei = np.stack([rng.integers(0, counts[names.index(s)], e),
                           rng.integers(0, counts[names.index(d)], e)])  # fmt: skip
            edges[(s, f"r{r}", d)] = torch.from_numpy(ei)
    if not edges:
        edges[(names[0], "self", names[0])] = torch.zeros((2, 0), dtype=torch.long)
    store = GraphStore.from_hetero(x_dict, edges)
    offsets = np.cumsum([0, *counts])
    ext = store.to_external(torch.arange(store.num_nodes)).numpy()
    for k, t in enumerate(store.node_types):
        assert (t.offset, t.count) == (offsets[k], counts[k])
        assert set(ext[t.offset : t.offset + t.count].tolist()) == set(
            range(offsets[k], offsets[k + 1])
        )
    for r, rel in enumerate(store.relations):
        s, _, d = rel.split("__")
        mask = store.edge_type == r
        src, dst = store.edge_index()[:, mask]
        ts, td = store.topology.node_type(s), store.topology.node_type(d)
        assert ((src >= ts.offset) & (src < ts.offset + ts.count)).all()
        assert ((dst >= td.offset) & (dst < td.offset + td.count)).all()


def test_save_open_and_per_type_lookup(tmp_path):
    x_dict = {"user": torch.randn(4, 3), "item": torch.randn(3, 5)}  # other widths: padded
    edges = {("user", "clicks", "item"): torch.tensor([[0, 1, 3], [2, 2, 0]]),
             ("item", "clicked-by", "user"): torch.tensor([[2, 2, 0], [0, 1, 3]])}  # fmt: skip
    store = GraphStore.from_hetero(x_dict, edges)
    assert store.feature_dim == 5 and [t.feature_dim for t in store.node_types] == [3, 5]
    row = store.topology.typed_storage([2], "item")
    assert torch.equal(store.features[row][0], x_dict["item"][2])
    assert torch.equal(
        store.features[store.topology.typed_storage([1], "user")][0, 3:], torch.zeros(2)
    )
    with pytest.raises(UnknownNodeError, match="3"):
        store.topology.typed_storage([3], "item")
    with pytest.raises(KeyError, match="no node type 'shop'"):
        store.topology.typed_storage([0], "shop")
    store.save(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["format_version"] == 3
    assert [t["name"] for t in meta["node_types"]] == ["user", "item"]
    again = GraphStore.open(tmp_path / "s")
    assert again.version == store.version and again.node_types == store.node_types
    assert "node_types=2" in repr(again)
    meta["node_types"][1]["offset"] = 3  # a gap: refused naming the type
    (tmp_path / "s" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphFormatError, match="node type 'item' starts at 3, expected 4"):
        GraphStore.open(tmp_path / "s")


def test_bad_edges_and_names_are_refused():
    x = {"user": torch.randn(2, 3), "item": torch.randn(2, 3)}
    with pytest.raises(ValueError, match=r"edge 1 of \('user', 'clicks', 'item'\): destination 5"):
        GraphStore.from_hetero(x, {("user", "clicks", "item"): torch.tensor([[0, 1], [1, 5]])})
    with pytest.raises(ValueError, match="node type 'shop' has no features and no count"):
        GraphStore.from_hetero(x, {("user", "buys", "shop"): torch.tensor([[0], [0]])})
    with pytest.raises(ValueError, match="'a__b' contains '__'"):
        GraphStore.from_hetero(
            {"a__b": torch.randn(1, 2)}, {("a__b", "r", "a__b"): torch.tensor([[0], [0]])}
        )


def test_synthetic_recommender_is_deterministic_with_informative_labels(tmp_path):
    g = recommender_graph(300, 200, 8, 16, seed=3)
    assert [t for t, _ in g.types] == ["user", "item", "category"]
    assert len(g.relations) == 6 and "item__belongs-to__category" in g.relations
    belongs = g.edge_type == g.relations.index("item__belongs-to__category")
    item_label = g.labels[g.src[belongs]]
    assert np.array_equal(item_label, g.dst[belongs] - g.offset("category"))  # label = category
    clicks = g.edge_type == g.relations.index("user__clicks__item")
    pref = g.labels[g.src[clicks]]
    hit = (g.labels[g.dst[clicks]] == pref).mean()
    assert hit > 0.6, f"clicks follow the preferred category {hit:.2f}"  # affinity 0.7
    a = synth_recommender(300, 200, 8, 16, seed=3, out=tmp_path / "a", progress=False)
    b = synth_recommender(300, 200, 8, 16, seed=3, progress=False)
    assert a.version == b.version and a.node_types == b.node_types
    f = fraud_graph(200, 100, 20, 500, 8, ring_fraction=0.1, seed=1)
    assert [t for t, _ in f.types] == ["account", "device", "merchant", "transaction"]
    assert 0 < f.labels[f.offset("transaction") :].mean() < 0.2


def test_an_rgcn_on_a_typed_store_equals_its_forward():
    from torch_geometric import nn as pyg

    data = _fake_hetero(1)
    homo = data.to_homogeneous()
    store = GraphStore.from_pyg(data)
    r = len(store.relations)

    class RGCN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = pyg.RGCNConv(homo.x.shape[1], 8, r, num_bases=2)
            self.c2 = pyg.RGCNConv(8, 4, r)

        def forward(self, x, edge_index, edge_type):
            return self.c2(self.c1(x, edge_index, edge_type).relu(), edge_index, edge_type)

    torch.manual_seed(0)
    model = RGCN().eval()
    with torch.no_grad():
        want = model(homo.x, homo.edge_index, homo.edge_type)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=9, progress=False)
    assert_exact(ev.evaluate(), want, "rgcn on the typed store")
    items = store.node_types[1]
    targets = torch.arange(items.offset, items.offset + min(5, items.count))
    assert_exact(ev.evaluate(targets=targets), want[targets], "rgcn, one type's nodes")


def test_cli_synth_recommender_and_fraud(tmp_path):
    from typer.testing import CliRunner

    from hopserve.cli import app

    runner = CliRunner()
    args = ["synth", "recommender", "--users", "120", "--items", "80", "--categories", "5",
            "--dim", "8", "--out", str(tmp_path / "rec"), "--no-progress"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "node_types=3" in res.output and "relations=6" in res.output
    rec = GraphStore.open(tmp_path / "rec")
    assert [(t.name, t.count) for t in rec.node_types] == [
        ("user", 120),
        ("item", 80),
        ("category", 5),
    ]
    res = runner.invoke(app, ["synth", "fraud", "--accounts", "50", "--devices", "30",
                              "--merchants", "10", "--transactions", "100", "--dim", "4",
                              "--out", str(tmp_path / "fraud"), "--no-progress"])  # fmt: skip
    assert res.exit_code == 0, res.output
    fraud = GraphStore.open(tmp_path / "fraud")
    assert fraud.relations[0] == "account__uses__device" and len(fraud.relations) == 6
    res = runner.invoke(app, args)  # the folder exists: refused without --force
    assert res.exit_code == 2 and "--force" in res.stderr
