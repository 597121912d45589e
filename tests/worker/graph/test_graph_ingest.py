"""Ingest: file formats, external IDs, validation errors (file + row), atomic output, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.worker.graph import GraphStore, IngestError, ingest
from hopserve.worker.graph import readers as ingest_mod

EDGES = [(0, 1), (2, 1), (1, 2), (3, 0), (0, 1), (2, 2), (4, 3)]  # node 5 isolated
N, F = 6, 3
IDS = np.array([100, 5, 42, 7, 9, 1], dtype=np.int64)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((N, F)).astype(np.float32)
    paths = {
        "features": tmp_path / "x.npy",
        "ids": tmp_path / "ids.npy",
        "labels": tmp_path / "y.npy",
    }
    np.save(paths["features"], feats)
    np.save(paths["ids"], IDS)
    np.save(paths["labels"], np.array([0, 1, 2, 0, 1, -1]))
    return paths


def _write_edges(path: Path, fmt: str, edges: list[tuple[int, int]]) -> Path:
    arr = np.array(edges, dtype=np.int64).reshape(-1, 2)
    if fmt == "csv":
        path = path.with_suffix(".csv")
        path.write_text("# src,dst\n" + "".join(f"{s},{d}\n" for s, d in edges))
    elif fmt == "tsv":
        path = path.with_suffix(".tsv")
        path.write_text("".join(f"{s}\t{d}\r\n" for s, d in edges))
    elif fmt == "txt":
        path = path.with_suffix(".txt")
        path.write_text("\n".join(f"  {s}   {d}  # edge" for s, d in edges) + "\n\n")
    elif fmt == "txt-commas":
        path = path.with_suffix(".edges")
        path.write_text("".join(f"{s}, {d}\n" for s, d in edges))
    elif fmt == "npy":
        path = path.with_suffix(".npy")
        np.save(path, arr.astype(np.int32))
    elif fmt == "npy-T":
        path = path.with_suffix(".npy")
        np.save(path, arr.T.copy())
    elif fmt == "npz":
        path = path.with_suffix(".npz")
        np.savez(path, src=arr[:, 0], dst=arr[:, 1].astype(np.uint32))
    elif fmt == "npz-ei":
        path = path.with_suffix(".npz")
        np.savez(path, edge_index=arr.T)
    return path


def _no_leftovers(parent: Path, out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in parent.iterdir() if p.name.startswith(".")] == []


FORMATS = ["csv", "tsv", "txt", "txt-commas", "npy", "npy-T", "npz", "npz-ei"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("external", [False, True])
def test_round_trip(tmp_path, files, reference, adjacency, fmt, external):
    edges = [(int(IDS[s]), int(IDS[d])) for s, d in EDGES] if external else EDGES
    epath = _write_edges(tmp_path / "edges", fmt, edges)
    out = tmp_path / "store"
    g = ingest(
        epath,
        files["features"],
        out=out,
        node_ids=files["ids"] if external else None,
        labels=files["labels"],
        progress=False,
    )
    assert g.path == out and g.num_nodes == N and g.num_edges == len(EDGES)
    ids = IDS if external else np.arange(N)
    ref = reference(EDGES, N)
    expect = {int(ids[v]): sorted(int(ids[s]) for s in srcs) for v, srcs in ref.items()}
    assert adjacency(g) == expect
    rows = g.to_storage(ids)
    torch.testing.assert_close(g.features[rows], torch.from_numpy(np.load(files["features"])))
    assert g.labels[rows].tolist() == [0, 1, 2, 0, 1, -1] and g.num_classes == 3
    assert GraphStore.open(out).version == g.version


def test_options_and_identity(tmp_path, files, reference, adjacency):
    epath = _write_edges(tmp_path / "e", "csv", EDGES)
    g = ingest(
        epath,
        files["features"],
        out=tmp_path / "s",
        symmetrize=True,
        add_self_loops=True,
        dedup=True,
        reorder="none",
        progress=False,
    )
    assert g.ordering == "identity" and g.node_ids is None
    assert g.meta.flags.symmetrized and g.meta.flags.self_loops and g.meta.flags.dedup
    assert adjacency(g) == reference(EDGES, N, symmetrize=True, add_self_loops=True, dedup=True)


def test_skip_header_and_float64_features(tmp_path, files, reference, adjacency):
    epath = tmp_path / "e.csv"
    epath.write_text("src,dst\n" + "".join(f"{s},{d}\n" for s, d in EDGES))
    np.save(tmp_path / "x64.npy", np.load(files["features"]).astype(np.float64))
    g = ingest(epath, tmp_path / "x64.npy", out=tmp_path / "s", skip_header=True, progress=False)
    assert g.features.dtype == torch.float32
    assert adjacency(g) == reference(EDGES, N)


def test_chunked_text_reading_and_late_errors(tmp_path, files, monkeypatch, reference, adjacency):
    monkeypatch.setattr(ingest_mod, "_TEXT_CHUNK", 16)  # many chunks, lines split across reads
    rng = np.random.default_rng(1)
    edges = [tuple(map(int, e)) for e in rng.integers(0, N, (200, 2))]
    epath = tmp_path / "e.txt"
    lines = ["# comment", ""] + [f"{s} {d}" for s, d in edges]
    epath.write_text("\n".join(lines) + "\n")
    g = ingest(epath, files["features"], out=tmp_path / "ok", progress=False)
    assert adjacency(g) == reference(edges, N)
    lines[150] = "3 6"  # out of range at file line 151
    epath.write_text("\n".join(lines) + "\n")
    with pytest.raises(IngestError, match=r"e\.txt: row 151: node ID 6 \(dst\) out of range"):
        ingest(epath, files["features"], out=tmp_path / "bad", progress=False)
    lines[150] = "3 x"
    epath.write_text("\n".join(lines) + "\n")
    with pytest.raises(IngestError, match=r"row 151: non-numeric value 'x'"):
        ingest(epath, files["features"], out=tmp_path / "bad", progress=False)
    _no_leftovers(tmp_path, tmp_path / "bad")


EDGE_CASES = [
    ("non-numeric", "e.csv", "0,1\n1,x\n", 2, "non-numeric value 'x'"),
    ("float", "e.csv", "0,1\n1.5,2\n", 2, "non-numeric value '1.5'"),
    ("ragged", "e.csv", "0,1\n1,2,3\n", 2, "expected 2 columns"),
    ("one column", "e.txt", "0 1\n\n4\n", 3, "expected 2 columns"),
    ("negative", "e.csv", "0,1\n# c\n-1,2\n", 3, "negative node ID -1 (src)"),
    ("out of range", "e.csv", "0,1\n1,6\n", 2, "node ID 6 (dst) out of range"),
    ("header", "e.csv", "src,dst\n0,1\n", 1, "use --skip-header"),
    ("huge", "e.csv", "0,1\n99999999999999999999,1\n", 2, "outside the int64 range"),
]


@pytest.mark.parametrize(
    ("case", "name", "text", "row", "msg"), EDGE_CASES, ids=[c[0] for c in EDGE_CASES]
)
def test_bad_edge_text(tmp_path, files, case, name, text, row, msg):
    epath = tmp_path / name
    epath.write_text(text)
    out = tmp_path / "out"
    with pytest.raises(IngestError) as info:
        ingest(epath, files["features"], out=out, progress=False)
    err = info.value
    assert err.file == str(epath) and err.row == row and msg in str(err)
    assert str(err).startswith(f"{epath}: row {row}: ")
    _no_leftovers(tmp_path, out)


def test_unknown_external_id(tmp_path, files):
    epath = tmp_path / "e.tsv"
    epath.write_text("100\t5\n5\t77\n")
    with pytest.raises(IngestError, match=r"e\.tsv: row 2: unknown node ID 77 \(dst; not in"):
        ingest(epath, files["features"], node_ids=files["ids"], out=tmp_path / "o", progress=False)
    np.save(tmp_path / "e.npy", np.array([[100, 5], [5, 42], [3, 5]]))
    with pytest.raises(IngestError, match=r"e\.npy: row 3: unknown node ID 3 \(src"):
        ingest(
            tmp_path / "e.npy",
            files["features"],
            node_ids=files["ids"],
            out=tmp_path / "o",
            progress=False,
        )
    _no_leftovers(tmp_path, tmp_path / "o")


def _bad_node_files(tmp_path, files):
    feats = np.load(files["features"])
    nan = feats.copy()
    nan[3, 1] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    inf64 = feats.astype(np.float64)
    inf64[4, 0] = 1e300  # overflows float32
    np.save(tmp_path / "inf64.npy", inf64)
    np.save(tmp_path / "int.npy", feats.astype(np.int64))
    np.save(tmp_path / "vec.npy", feats[:, 0])
    np.save(tmp_path / "dup.npy", np.array([1, 2, 3, 2, 5, 6]))
    np.save(tmp_path / "short_ids.npy", np.arange(5))
    np.save(tmp_path / "short_y.npy", np.zeros(5, np.int64))
    np.save(tmp_path / "float_y.npy", np.zeros(N))
    np.save(tmp_path / "neg_y.npy", np.array([0, 1, -2, 0, 0, 0]))
    np.save(tmp_path / "e3.npy", np.zeros((4, 1), np.int64))
    np.save(tmp_path / "ef.npy", np.zeros((4, 2)))
    np.savez(tmp_path / "wrong.npz", a=np.zeros(3))
    (tmp_path / "x.csv").write_text("1,2\n")


NODE_CASES = [
    # (features, node_ids, labels, edges, file that is named, row, message)
    ("nan.npy", None, None, None, "nan.npy", 4, "NaN or Inf"),
    ("inf64.npy", None, None, None, "inf64.npy", 5, "NaN or Inf"),
    ("int.npy", None, None, None, "int.npy", None, "dtype int64"),
    ("vec.npy", None, None, None, "vec.npy", None, "expected [N, F]"),
    ("x.csv", None, None, None, "x.csv", None, "expected a .npy file"),
    (None, "dup.npy", None, None, "dup.npy", 4, "duplicate node ID 2 (first at row 2)"),
    (None, "short_ids.npy", None, None, "x.npy", None, "6 feature rows but"),
    (None, None, "short_y.npy", None, "short_y.npy", None, "has 5 rows, expected 6"),
    (None, None, "float_y.npy", None, "float_y.npy", None, "expected integers"),
    (None, None, "neg_y.npy", None, "neg_y.npy", 3, "label -2"),
    (None, None, None, "e3.npy", "e3.npy", None, "expected [E, 2], [2, E] or [E, 2 + k]"),
    (None, None, None, "ef.npy", "ef.npy", None, "expected an integer dtype"),
    (None, None, None, "wrong.npz", "wrong.npz", None, "expected arrays 'src' and 'dst'"),
    (None, None, None, "missing.csv", "missing.csv", None, "no such file"),
]


@pytest.mark.parametrize(("feats", "ids", "labels", "edges", "named", "row", "msg"), NODE_CASES)
def test_bad_node_files(tmp_path, files, feats, ids, labels, edges, named, row, msg):
    _bad_node_files(tmp_path, files)
    epath = tmp_path / edges if edges else _write_edges(tmp_path / "e", "csv", EDGES)
    out = tmp_path / "out"
    with pytest.raises(IngestError) as info:
        ingest(
            epath,
            tmp_path / feats if feats else files["features"],
            node_ids=tmp_path / ids if ids else None,
            labels=tmp_path / labels if labels else None,
            out=out,
            progress=False,
        )
    assert Path(info.value.file).name == named and info.value.row == row
    assert msg in str(info.value)
    _no_leftovers(tmp_path, out)


def test_refuses_nonempty_out_before_reading(tmp_path, files):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "f").write_text("x")
    with pytest.raises(FileExistsError):
        ingest(
            tmp_path / "nonexistent.csv", files["features"], out=tmp_path / "out", progress=False
        )


# ---------------------------------------------------------------------------- CLI
runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(app, ["ingest", *map(str, args), "--no-progress"])


def test_cli_ingest_and_force(tmp_path, files):
    epath = _write_edges(tmp_path / "e", "csv", EDGES)
    out = tmp_path / "store"
    base = ("--edges", epath, "--features", files["features"], "--out", out)
    res = _cli(*base)
    assert res.exit_code == 0, res.output
    assert "wrote" in res.stdout and GraphStore.open(out).num_edges == len(EDGES)
    first = GraphStore.open(out).version
    res = _cli(*base, "--symmetrize")
    assert res.exit_code == 2 and "error:" in res.stderr and "--force" in res.stderr
    assert GraphStore.open(out).version == first
    forced = (*base, "--symmetrize", "--force")
    res = _cli(*forced, "--node-ids", files["ids"], "--reorder", "none", "--delimiter", ",")
    assert res.exit_code == 2 and "unknown node ID 0" in res.stderr  # edges use row indices
    res = _cli(*forced, "--labels", files["labels"], "--self-loops", "--dedup", "--reorder", "none")
    assert res.exit_code == 0, res.output
    g = GraphStore.open(out)
    assert g.version != first and g.meta.flags.symmetrized and g.ordering == "identity"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_bad_input_exit_2_clean_message(tmp_path, files):
    epath = tmp_path / "e.csv"
    epath.write_text("0,1\n1,2\n2,oops\n")
    out = tmp_path / "store"
    res = _cli("--edges", epath, "--features", files["features"], "--out", out)
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {epath}: row 3: non-numeric value 'oops'"
    assert "Traceback" not in res.output
    _no_leftovers(tmp_path, out)
    res = _cli("--edges", epath, "--features", files["features"], "--out", out, "--delimiter", "??")
    assert res.exit_code == 2 and "unknown --delimiter" in res.stderr
