"""``GraphStore.from_dgl`` and ``hopserve ingest --from-dgl``."""

from __future__ import annotations

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from support import assert_exact, random_edge_index  # noqa: E402
from support.dgl_models import build  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from hopserve import GraphStore, LayerwiseEvaluator  # noqa: E402
from hopserve.cli import app  # noqa: E402

pytestmark = pytest.mark.dgl


def _graph(n: int = 200, key: str = "feat") -> dgl.DGLGraph:
    ei = random_edge_index(n, 900, seed=3)
    g = dgl.graph((ei[0], ei[1]), num_nodes=n)
    g.ndata[key] = torch.randn(n, 6, generator=torch.Generator().manual_seed(4))
    g.ndata["label"] = torch.arange(n) % 7
    return g


@pytest.mark.parametrize("reorder", ["rcmk", None])
def test_from_dgl_round_trip(reorder, tmp_path):
    g = _graph()
    store = GraphStore.from_dgl(g, reorder=reorder)
    assert (store.num_nodes, store.num_edges, store.feature_dim) == (200, g.num_edges(), 6)
    # Same adjacency and rows, in external (DGL) node IDs.
    ext = store.to_external(torch.arange(store.num_nodes))
    dst = torch.repeat_interleave(ext, store.in_degrees)
    src = ext[store.indices.long()]
    got = sorted(zip(src.tolist(), dst.tolist(), strict=True))
    want = sorted(zip(*(t.tolist() for t in g.edges()), strict=True))
    assert got == want
    assert torch.equal(store.features[store.to_storage(torch.arange(200))], g.ndata["feat"])
    assert torch.equal(store.labels[store.to_storage(torch.arange(200))], g.ndata["label"])
    store.save(tmp_path / "g", progress=False)
    again = GraphStore.open(tmp_path / "g")
    assert again.version == store.version
    # A model on the store equals the model on the DGL graph, in DGL's node IDs.
    model = build("sage_mean", 6)
    with torch.no_grad():
        want = model(g, g.ndata["feat"])
    ev = LayerwiseEvaluator(model, again, progress=False)
    assert_exact(ev.evaluate(), want, "from_dgl model output")


def test_from_dgl_feature_keys_and_refusals():
    g = _graph(key="x")
    assert GraphStore.from_dgl(g).feature_dim == 6  # falls back to "x"
    g.ndata["emb"] = torch.randn(200, 3)
    assert GraphStore.from_dgl(g, feature_key="emb").feature_dim == 3
    with pytest.raises(ValueError, match="no key 'nope'"):
        GraphStore.from_dgl(g, feature_key="nope")
    bare = dgl.graph(([0, 1], [1, 2]))
    with pytest.raises(ValueError, match=r"no node features under 'feat' or 'x'"):
        GraphStore.from_dgl(bare)
    hetero = dgl.heterograph(
        {("user", "follows", "user"): ([0], [1]), ("user", "buys", "item"): ([0], [0])}
    )
    typed = GraphStore.from_dgl(hetero)  # a heterograph: a typed store (no features here)
    assert [t.name for t in typed.node_types] == ["item", "user"]
    assert typed.relations == ["user__buys__item", "user__follows__user"]


def test_cli_ingest_from_dgl(tmp_path):
    g = _graph()
    path = tmp_path / "graph.bin"
    dgl.save_graphs(str(path), [g])
    runner = CliRunner()
    out = tmp_path / "store"
    res = runner.invoke(
        app, ["ingest", "--from-dgl", str(path), "--out", str(out), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    store = GraphStore.open(out)
    assert (store.num_nodes, store.num_edges) == (200, g.num_edges())
    assert store.labels is not None and store.ordering == "rcmk"

    res = runner.invoke(
        app,
        ["ingest", "--from-dgl", str(path), "--feature-key", "nope", "--out", str(tmp_path / "b")],
    )
    assert res.exit_code == 2 and "no key 'nope'" in res.output
    res = runner.invoke(
        app, ["ingest", "--from-dgl", str(path), "--edges", "e.csv", "--out", str(tmp_path / "c")]
    )
    assert res.exit_code == 2 and "cannot be combined with --edges" in res.output
    res = runner.invoke(
        app, ["ingest", "--from-dgl", str(tmp_path / "missing.bin"), "--out", str(tmp_path / "d")]
    )
    assert res.exit_code == 2 and "no such file" in res.output
    res = runner.invoke(app, ["ingest", "--out", str(tmp_path / "e")])
    assert res.exit_code == 2 and "missing --edges and --features" in res.output


def test_from_dgl_takes_edge_weight_and_features():
    g = _graph(60)
    gen = torch.Generator().manual_seed(5)
    g.edata["w"] = torch.rand(g.num_edges(), generator=gen) + 0.1
    g.edata["feat"] = torch.randn(g.num_edges(), 3, generator=gen)
    store = GraphStore.from_dgl(g)
    assert store.meta.has_edge_weight and store.meta.edge_feature_dim == 3
    ext = store.to_external(store.edge_index())
    src, dst = g.edges()

    def rows(s, d, w, f):
        return sorted(zip(s.tolist(), d.tolist(), w.tolist(), map(tuple, f.tolist()), strict=True))

    assert rows(ext[0], ext[1], store.edge_weight, store.edge_features) == rows(
        src, dst, g.edata["w"], g.edata["feat"]
    )
    none = GraphStore.from_dgl(g, edge_weight_key=None, edge_feature_key=None)
    assert none.edge_weight is None and none.edge_features is None
    with pytest.raises(ValueError, match="edata has no key 'weight'"):
        GraphStore.from_dgl(g, edge_weight_key="weight")
