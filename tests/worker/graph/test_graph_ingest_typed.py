"""Typed ingest: per-type node files and per-relation edge files (any edge format, edge
data columns) give the typed store of ``from_hetero``; errors name the file, row and type,
and nothing is written."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hopserve import GraphStore
from hopserve.cli import app
from hopserve.worker.graph import IngestError
from hopserve.worker.graph.ingest_typed import ingest_typed

USERS, ITEMS = 5, 4
CLICKS = [(0, 1), (1, 1), (4, 3), (2, 0), (0, 1)]  # (user, item); (0, 1) twice


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "users.npy", rng.standard_normal((USERS, 3)).astype(np.float32))
    np.save(tmp_path / "items.npy", rng.standard_normal((ITEMS, 5)).astype(np.float32))
    np.save(tmp_path / "item_labels.npy", np.arange(ITEMS))
    (tmp_path / "clicks.csv").write_text(
        "".join(f"{u},{i},{k + 0.5}\n" for k, (u, i) in enumerate(CLICKS))
    )
    np.save(
        tmp_path / "rev.npy",
        np.array([[i, u, k + 0.5] for k, (u, i) in enumerate(CLICKS)], dtype=np.float64),
    )
    return tmp_path


def _typed_edges(store: GraphStore) -> Counter:
    ext = store.to_external(store.edge_index())
    return Counter(zip(ext[0].tolist(), ext[1].tolist(), store.edge_type.tolist(),
                       store.edge_weight.tolist(), strict=True))  # fmt: skip


def test_typed_ingest_equals_from_hetero(files):
    store = ingest_typed(
        {"user": files / "users.npy", "item": files / "items.npy"},
        {("user", "clicks", "item"): files / "clicks.csv",
         ("item", "clicked-by", "user"): files / "rev.npy"},
        labels={"item": files / "item_labels.npy"}, out=files / "s", progress=False,
    )  # fmt: skip
    ei = torch.tensor(CLICKS).T
    w = torch.arange(len(CLICKS)) + 0.5
    want = GraphStore.from_hetero(
        {"user": torch.from_numpy(np.load(files / "users.npy")),
         "item": torch.from_numpy(np.load(files / "items.npy"))},
        {("user", "clicks", "item"): ei, ("item", "clicked-by", "user"): ei.flip(0)},
        edge_weight=torch.cat([w, w]).numpy(),
    )  # fmt: skip
    assert store.relations == ["user__clicks__item", "item__clicked-by__user"]
    assert [(t.name, t.count, t.feature_dim) for t in store.node_types] == [
        ("user", 5, 3),
        ("item", 4, 5),
    ]
    assert _typed_edges(store) == _typed_edges(want)
    order = store.sorted_external_order()
    assert torch.equal(store.features[order], want.features[want.sorted_external_order()])
    items = store.topology.typed_storage(np.arange(ITEMS), "item")
    assert store.labels[items].tolist() == list(range(ITEMS))


def test_bad_input_names_file_row_and_type(files):
    (files / "bad.csv").write_text("0,1,1.0\n1,9,1.0\n")
    nodes = {"user": files / "users.npy", "item": files / "items.npy"}
    with pytest.raises(
        IngestError, match=r"bad.csv: row 2: dst 9 is not a 'item' node \(its IDs are 0..3\)"
    ):
        ingest_typed(
            nodes, {("user", "clicks", "item"): files / "bad.csv"}, out=files / "s", progress=False
        )
    with pytest.raises(IngestError, match="names node type 'shop', which has no node file"):
        ingest_typed(
            nodes, {("user", "buys", "shop"): files / "clicks.csv"}, out=files / "s", progress=False
        )
    (files / "plain.csv").write_text("0,1\n")
    with pytest.raises(IngestError, match="every relation needs the same columns"):
        ingest_typed(nodes, {("user", "clicks", "item"): files / "clicks.csv",
                             ("item", "clicked-by", "user"): files / "plain.csv"},
                     out=files / "s", progress=False)  # fmt: skip
    assert not (files / "s").exists()


def test_cli_ingest_typed(files):
    args = ["ingest-typed", "--nodes", f"user={files / 'users.npy'}", "--nodes",
            f"item={files / 'items.npy'}", "--edges", f"user:clicks:item={files / 'clicks.csv'}",
            "--out", str(files / "s"), "--no-progress"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "node_types=2" in res.output and "relations=1" in res.output
    res = CliRunner().invoke(
        app, [*args[:-3], "--edges", "user:clicks=x.csv", "--out", str(files / "t")]
    )
    assert res.exit_code == 2 and "expected SRC:RELATION:DST=PATH" in res.stderr
