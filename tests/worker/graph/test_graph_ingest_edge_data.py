"""Ingest of edge data columns: text (``src,dst,weight,f1..fk``), .npy ``[E, 2 + k]``, .npz
arrays, the CLI's ``--edge-data``, and errors naming the file, row and bad value."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.worker.graph import GraphStore, IngestError, ingest

EDGES = [(0, 1), (2, 1), (1, 2), (3, 0), (0, 1), (2, 2), (4, 3)]  # node 5 isolated; (0,1) twice
W = [0.5, 1.5, 2.0, -1.0, 3.25, 1.0, 0.125]
FEATS = [[float(i), float(-i) / 4] for i in range(len(EDGES))]
N, F = 6, 3


@pytest.fixture
def features(tmp_path: Path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).standard_normal((N, F)).astype(np.float32))
    return path


def _stored(g: GraphStore) -> Counter:
    ext = g.to_external(g.edge_index()).T.tolist()
    w = [None] * len(ext) if g.edge_weight is None else g.edge_weight.tolist()
    f = [None] * len(ext) if g.edge_features is None else g.edge_features.tolist()
    return Counter(
        (s, d, a, None if b is None else tuple(b)) for (s, d), a, b in zip(ext, w, f, strict=True)
    )


def _expected(weight=True, feats=True) -> Counter:
    return Counter(
        (s, d, w if weight else None, tuple(f) if feats else None)
        for (s, d), w, f in zip(EDGES, W, FEATS, strict=True)
    )


def _csv(tmp_path: Path, rows: list[str], name: str = "e.csv") -> Path:
    path = tmp_path / name
    path.write_text("".join(r + "\n" for r in rows))
    return path


@pytest.mark.parametrize("reorder", ["rcmk", "none"])
def test_csv_weight_and_feature_columns(tmp_path, features, reorder):
    rows = [f"{s},{d},{w},{f[0]},{f[1]}" for (s, d), w, f in zip(EDGES, W, FEATS, strict=True)]
    g = ingest(_csv(tmp_path, rows), features, out=tmp_path / "g", reorder=reorder, progress=False)
    assert g.meta.has_edge_weight and g.meta.edge_feature_dim == 2
    assert _stored(g) == _expected()


def test_weight_only_and_features_only(tmp_path, features):
    rows = [f"{s} {d} {w}" for (s, d), w in zip(EDGES, W, strict=True)]
    g = ingest(_csv(tmp_path, rows, "e.txt"), features, out=tmp_path / "w", progress=False)
    assert g.edge_features is None and _stored(g) == _expected(feats=False)
    rows = [f"{s}\t{d}\t{f[0]}\t{f[1]}" for (s, d), f in zip(EDGES, FEATS, strict=True)]
    g = ingest(
        _csv(tmp_path, rows, "e.tsv"), features, out=tmp_path / "f", edge_data="features",
        progress=False,
    )  # fmt: skip
    assert g.edge_weight is None and _stored(g) == _expected(weight=False)


def test_npy_and_npz(tmp_path, features):
    arr = np.column_stack([np.array(EDGES, dtype=np.float64), W, FEATS])
    np.save(tmp_path / "e.npy", arr)
    g = ingest(tmp_path / "e.npy", features, out=tmp_path / "a", progress=False)
    assert _stored(g) == _expected()
    src, dst = np.array(EDGES).T
    np.savez(tmp_path / "e.npz", src=src, dst=dst, edge_weight=np.array(W), edge_attr=FEATS)
    g = ingest(tmp_path / "e.npz", features, out=tmp_path / "b", progress=False)
    assert _stored(g) == _expected()
    np.save(tmp_path / "bad.npy", np.column_stack([arr[:, :1] + 0.5, arr[:, 1:]]))
    with pytest.raises(IngestError, match=r"bad\.npy: row 1: src/dst .* not whole node IDs"):
        ingest(tmp_path / "bad.npy", features, out=tmp_path / "c", progress=False)


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (["0,1,0.5", "2,1,nan"], r"e\.csv: row 2: edge weight nan is not a finite"),
        (["0,1,0.5,1", "2,1,inf,2"], r"e\.csv: row 2: edge weight inf is not a finite"),
        (["0,1,0.5", "2,1,1e40"], r"e\.csv: row 2: edge weight 1e\+40 is not a finite float32"),
        (["0,1,0.5,1", "2,1,2,3", "1,2,x,4"], r"e\.csv: row 3: non-numeric edge data 'x'"),
        (["0,1,0.5", "2,1"], r"e\.csv: row 2: expected 3 columns \(src, dst and 1 edge data"),
        (["0,1,0.5", "2,1,1,7"], r"e\.csv: row 2: expected 3 columns"),
        (["0,1,0.5", "2.5,1,1"], r"e\.csv: row 2: non-numeric value '2\.5'"),
        (["0,1,0.5,1", "# c", "", "2,1,2,nan"], r"e\.csv: row 4: edge features \[nan\]"),
    ],
)
def test_bad_edge_data_names_file_row_and_value(tmp_path, features, rows, match):
    with pytest.raises(IngestError, match=match):
        ingest(_csv(tmp_path, rows), features, out=tmp_path / "g", progress=False)
    assert not (tmp_path / "g").exists()


def test_transforms_with_edge_data(tmp_path, features):
    path = _csv(tmp_path, ["0,1,0.5", "2,1,1", "1,0,3"])
    with pytest.raises(IngestError, match=r"e\.csv: has edge data columns, which --dedup"):
        ingest(path, features, out=tmp_path / "g", dedup=True, progress=False)
    g = ingest(path, features, out=tmp_path / "s", symmetrize=True, progress=False)
    assert _stored(g) == Counter(
        [(0, 1, 0.5, None), (2, 1, 1.0, None), (1, 0, 3.0, None), (1, 2, 1.0, None)]
    )  # 2 -> 1 mirrored with its weight; 0 -> 1 and 1 -> 0 kept as given


def test_cli_edge_data_option(tmp_path, features):
    rows = [f"{s},{d},{f[0]},{f[1]}" for (s, d), f in zip(EDGES, FEATS, strict=True)]
    path = _csv(tmp_path, rows)
    res = CliRunner().invoke(
        app,
        ["ingest", "--edges", str(path), "--features", str(features), "--out",
         str(tmp_path / "g"), "--edge-data", "features", "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "edge_dim=2" in res.output
    g = GraphStore.open(tmp_path / "g")
    assert g.edge_weight is None and _stored(g) == _expected(weight=False)
    help_text = CliRunner().invoke(app, ["ingest", "--help"]).output
    assert "--edge-data" in help_text


def test_parquet_columns(tmp_path, features):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src, dst = (list(c) for c in zip(*EDGES, strict=True))
    table = pa.table({"src": src, "dst": dst, "weight": W, "feat": FEATS})  # a list column
    pq.write_table(table, tmp_path / "e.parquet")
    g = ingest(tmp_path / "e.parquet", features, out=tmp_path / "a", progress=False)
    assert _stored(g) == _expected()
    a, b = (pa.array([f[k] for f in FEATS]) for k in (0, 1))
    table = pa.table({"dst": dst, "src": src, "f0": a, "f1": b})  # by name, any order
    pq.write_table(table, tmp_path / "f.parquet")
    g = ingest(
        tmp_path / "f.parquet", features, out=tmp_path / "b", edge_data="features",
        progress=False,
    )  # fmt: skip
    assert _stored(g) == _expected(weight=False)
    bad = W.copy()
    bad[3] = float("nan")
    pq.write_table(pa.table({"src": src, "dst": dst, "w": bad}), tmp_path / "nan.parquet")
    with pytest.raises(IngestError, match=r"nan\.parquet: row 4: edge weight nan"):
        ingest(tmp_path / "nan.parquet", features, out=tmp_path / "c", progress=False)
    table = pa.table({"src": src, "dst": dst, "w": [str(v) for v in W]})
    pq.write_table(table, tmp_path / "str.parquet")
    with pytest.raises(IngestError, match=r"str\.parquet: column 'w': string, expected numbers"):
        ingest(tmp_path / "str.parquet", features, out=tmp_path / "d", progress=False)
    table = pa.table({"src": src, "dst": dst, "w": pa.array([1.0, None] + W[2:])})
    pq.write_table(table, tmp_path / "null.parquet")
    with pytest.raises(IngestError, match=r"null\.parquet: row 2: column 'w' is null"):
        ingest(tmp_path / "null.parquet", features, out=tmp_path / "e", progress=False)
