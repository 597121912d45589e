"""Ingest of typed edges: a relation column in text and ``.npy`` (``--relation-column``),
``.npz`` arrays (ids or names), Parquet relation columns (ids, strings, dictionary
strings), the CLI flag, and errors naming the file and row."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.worker.graph import GraphStore, IngestError, ingest

EDGES = [(0, 1), (2, 1), (1, 2), (3, 0), (0, 1), (2, 2), (4, 3)]  # (0,1) twice, other relation
REL = [0, 2, 1, 0, 1, 2, 0]
NAMES = ["buys", "clicks", "views"]
W = [0.5, 1.5, 2.0, -1.0, 3.25, 1.0, 0.125]
N, F = 6, 3


@pytest.fixture
def features(tmp_path: Path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).standard_normal((N, F)).astype(np.float32))
    return path


def _stored(g: GraphStore) -> Counter:
    ext = g.to_external(g.edge_index()).T.tolist()
    w = [None] * len(ext) if g.edge_weight is None else g.edge_weight.tolist()
    names = [g.relations[r] for r in g.edge_type.tolist()]
    return Counter((s, d, r, a) for (s, d), r, a in zip(ext, names, w, strict=True))


def _expected(weight: bool = False, names: list[str] | None = None) -> Counter:
    names = names or [str(r) for r in range(3)]
    return Counter(
        (s, d, names[r], w if weight else None) for (s, d), r, w in zip(EDGES, REL, W, strict=True)
    )


def test_csv_relation_column_then_weight(tmp_path, features):
    path = tmp_path / "e.csv"
    path.write_text(
        "".join(f"{s},{d},{r},{w}\n" for (s, d), r, w in zip(EDGES, REL, W, strict=True))
    )
    g = ingest(path, features, out=tmp_path / "s", relation_column=True, progress=False)
    assert g.relations == ["0", "1", "2"]
    assert _stored(g) == _expected(weight=True)


def test_npy_relation_column(tmp_path, features):
    path = tmp_path / "e.npy"
    np.save(path, np.array([[s, d, r] for (s, d), r in zip(EDGES, REL, strict=True)]))
    g = ingest(path, features, out=tmp_path / "s", relation_column=True, progress=False)
    assert _stored(g) == _expected()


def test_npz_ids_with_names_and_string_relations(tmp_path, features):
    src, dst = np.array(EDGES).T
    np.savez(tmp_path / "a.npz", src=src, dst=dst, edge_type=np.array(REL), relations=NAMES)
    g = ingest(tmp_path / "a.npz", features, out=tmp_path / "s1", progress=False)
    assert g.relations == NAMES and _stored(g) == _expected(names=NAMES)
    np.savez(tmp_path / "b.npz", src=src, dst=dst, relation=np.array(NAMES)[REL])
    g = ingest(tmp_path / "b.npz", features, out=tmp_path / "s2", progress=False)
    assert _stored(g) == _expected(names=NAMES)


@pytest.mark.parametrize("kind", ["ids", "strings", "dictionary"])
def test_parquet_relation_column(tmp_path, features, kind):
    src, dst = np.array(EDGES).T
    rel = {
        "ids": pa.array(REL, type=pa.int8()),
        "strings": pa.array(np.array(NAMES)[REL].tolist()),
        "dictionary": pa.array(np.array(NAMES)[REL].tolist()).dictionary_encode(),
    }[kind]
    table = pa.table({"src": src, "dst": dst, "relation": rel, "weight": W})
    pq.write_table(table, tmp_path / "e.parquet")
    g = ingest(tmp_path / "e.parquet", features, out=tmp_path / "s", progress=False)
    assert _stored(g) == _expected(weight=True, names=None if kind == "ids" else NAMES)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0,1,0\n2,1,-3\n", r"e.csv: row 2: relation -3.0 is not a relation id"),
        ("0,1,0\n2,1,1.5\n", r"e.csv: row 2: relation 1.5 is not a relation id"),
        ("0,1\n2,1\n", "has no relation column"),
    ],
)
def test_bad_relation_ids_name_file_and_row(tmp_path, features, text, match):
    (tmp_path / "e.csv").write_text(text)
    with pytest.raises(IngestError, match=match):
        ingest(tmp_path / "e.csv", features, out=tmp_path / "s", relation_column=True)
    assert not (tmp_path / "s").exists()


def test_npz_unknown_relation_name_is_refused(tmp_path, features):
    np.savez(tmp_path / "e.npz", src=[0, 1], dst=[1, 2], relation=["a", "z"], relations=["a"])
    with pytest.raises(IngestError, match="unknown relation 'z'"):
        ingest(tmp_path / "e.npz", features, out=tmp_path / "s")


def test_cli_relation_column(tmp_path, features):
    path = tmp_path / "e.tsv"
    path.write_text("".join(f"{s}\t{d}\t{r}\n" for (s, d), r in zip(EDGES, REL, strict=True)))
    args = ["ingest", "--edges", str(path), "--features", str(features), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "s"), "--relation-column"])
    assert result.exit_code == 0, result.output
    assert "relations=3" in result.output
    assert _stored(GraphStore.open(tmp_path / "s")) == _expected()
