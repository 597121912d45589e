"""GraphStore: open (memmap), save (atomic), version ids, meta validation, ID lookup."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hopserve
from hopserve.worker.graph import GraphFormatError, GraphStore, UnknownNodeError
from hopserve.worker.graph import contents as build_mod


def _small(reorder="rcmk", seed=0, n=30, e=90, **kw):
    rng = np.random.default_rng(seed)
    ei = torch.from_numpy(rng.integers(0, n, (2, e)))
    x = torch.from_numpy(rng.standard_normal((n, 4)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 3, n))
    return GraphStore.from_edge_index(ei, x, labels=y, reorder=reorder, **kw), ei, x, y


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_lazy_reexport():
    assert hopserve.GraphStore is GraphStore


def test_save_open_round_trip(tmp_path, adjacency):
    g, ei, x, y = _small()
    g.save(tmp_path / "g", progress=False)
    h = GraphStore.open(tmp_path / "g")
    assert h.path == tmp_path / "g" and h.version == g.version and h.ordering == "rcmk"
    assert (h.num_nodes, h.num_edges, h.feature_dim) == (30, 90, 4)
    assert h.indptr.dtype == torch.int64 and h.indices.dtype == torch.int32
    for name in ("indptr", "indices", "features", "labels", "node_ids"):
        torch.testing.assert_close(getattr(h, name), getattr(g, name))
    assert adjacency(h) == adjacency(g)
    assert h.meta.flags == g.meta.flags and h.meta.num_classes == 3
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    assert meta["format_version"] == 1 and meta["has_node_ids"] and meta["has_labels"]
    assert "GraphStore(nodes=30, edges=90" in repr(h)


def test_open_is_zero_copy_memmap(tmp_path, monkeypatch):
    g, *_ = _small()
    g.save(tmp_path / "g", progress=False)
    loaded = {}
    real_load = np.load

    def spy(path, *args, **kw):
        arr = real_load(path, *args, **kw)
        loaded[Path(path).name] = arr
        return arr

    monkeypatch.setattr(np, "load", spy)
    h = GraphStore.open(tmp_path / "g")
    monkeypatch.undo()
    feats = loaded["features.npy"]
    assert isinstance(feats, np.memmap) and feats.mode == "c"
    assert h.features.data_ptr() == feats.ctypes.data  # tensor shares the memmap
    assert h.indices.data_ptr() == loaded["indices.npy"].ctypes.data
    # copy-on-write: in-place edits never reach the file
    h.features[0, 0] = 12345.0
    assert GraphStore.open(tmp_path / "g").features[0, 0] != 12345.0
    # mmap=False loads into memory
    assert not isinstance(
        GraphStore.open(tmp_path / "g", mmap=False).features.numpy().base, np.memmap
    )


def test_version_stable_and_content_sensitive(tmp_path):
    a, ei, x, y = _small()
    b, *_ = _small()
    assert a.version == b.version and len(a.version) == 32
    x2 = x.clone()
    x2[3, 1] += 1.0
    assert GraphStore.from_edge_index(ei, x2, labels=y).version != a.version
    ei2 = ei.clone()
    ei2[0, 0] = (ei2[0, 0] + 1) % 30
    assert GraphStore.from_edge_index(ei2, x, labels=y).version != a.version
    assert GraphStore.from_edge_index(ei, x).version != a.version  # labels dropped
    assert _small(reorder=None)[0].version != a.version
    a.save(tmp_path / "a", progress=False)
    assert GraphStore.open(tmp_path / "a").version == a.version


def test_identity_store_has_no_node_ids_and_no_copy():
    n = 10
    x = torch.randn(n, 3)
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    g = GraphStore.from_edge_index(ei, x, reorder=None)
    assert g.node_ids is None and g.ordering == "identity"
    assert g.features.data_ptr() == x.data_ptr()
    torch.testing.assert_close(g.to_storage([3, 0]), torch.tensor([3, 0]))
    torch.testing.assert_close(g.sorted_external_order(), torch.arange(n))
    with pytest.raises(UnknownNodeError, match=r"\(2 of 3 requested\): -1, 10"):
        g.to_storage(torch.tensor([1, 10, -1]))


def test_external_ids_lookup():
    x = torch.randn(4, 2)
    ids = torch.tensor([1000, 7, 42, 5])
    ei = torch.tensor([[0, 1, 3], [1, 2, 0]])  # row indices of x
    for reorder in (None, "rcmk"):
        g = GraphStore.from_edge_index(ei, x, node_ids=ids, reorder=reorder)
        s = g.to_storage(torch.tensor([[42, 1000], [5, 7]]))
        assert s.shape == (2, 2) and s.dtype == torch.int64
        torch.testing.assert_close(g.to_external(s), torch.tensor([[42, 1000], [5, 7]]))
        torch.testing.assert_close(g.features[g.to_storage(ids)], x)
        torch.testing.assert_close(
            g.node_ids[g.sorted_external_order()], torch.tensor([5, 7, 42, 1000])
        )
        with pytest.raises(UnknownNodeError) as info:
            g.to_storage([7, 8])
        assert info.value.unknown.tolist() == [8]
        with pytest.raises(IndexError):
            g.to_external([4])
        with pytest.raises(TypeError):
            g.to_storage(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="duplicate"):
        GraphStore.from_edge_index(ei, x, node_ids=torch.tensor([1, 2, 1, 3]))


def test_degrees():
    ei = torch.tensor([[0, 0, 1, 2], [1, 2, 2, 2]])
    g = GraphStore.from_edge_index(ei, torch.zeros(4, 1), reorder=None)
    assert g.in_degrees.tolist() == [0, 1, 3, 0]
    assert g.out_degrees.tolist() == [2, 1, 1, 0]
    assert g.avg_degree == 1.0
    assert g.in_degrees is g.in_degrees  # cached


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_from_pyg():
    from torch_geometric.data import Data

    data = Data(x=torch.randn(5, 2), edge_index=torch.tensor([[0, 1], [1, 4]]), y=torch.arange(5))
    g = GraphStore.from_pyg(data, reorder=None)
    assert g.labels.tolist() == [0, 1, 2, 3, 4] and g.num_classes == 5
    assert GraphStore.from_pyg(data, labels=None).labels is None


def test_float64_and_float16_features():
    ei = torch.tensor([[0], [1]])
    g = GraphStore.from_edge_index(ei, torch.randn(2, 3, dtype=torch.float64), reorder=None)
    assert g.features.dtype == torch.float32 and g.meta.feature_dtype == "float32"
    h = GraphStore.from_edge_index(ei, torch.randn(2, 3).half())
    assert h.features.dtype == torch.float16 and h.meta.feature_dtype == "float16"


def test_save_refuses_overwrite_then_swaps_atomically(tmp_path):
    a, *_ = _small(seed=0)
    b, *_ = _small(seed=1)
    a.save(tmp_path / "g", progress=False)
    opened = GraphStore.open(tmp_path / "g")
    with pytest.raises(FileExistsError, match="not empty"):
        b.save(tmp_path / "g", progress=False)
    assert GraphStore.open(tmp_path / "g").version == a.version
    b.save(tmp_path / "g", overwrite=True, progress=False)
    assert GraphStore.open(tmp_path / "g").version == b.version
    assert _leftovers(tmp_path) == []
    torch.testing.assert_close(opened.features, a.features)  # old mapping stays valid
    (tmp_path / "empty").mkdir()
    a.save(tmp_path / "empty", progress=False)  # an empty directory is fine
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a hopserve graph store"):
        a.save(tmp_path / "other", overwrite=True, progress=False)


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    g, *_ = _small()

    def boom(*args, **kw):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(build_mod, "write_meta", boom)
    with pytest.raises(RuntimeError):
        g.save(tmp_path / "new" / "deeper" / "g", progress=False)
    assert list(tmp_path.iterdir()) == []  # no temp dir, no created parents
    monkeypatch.undo()
    g.save(tmp_path / "keep", progress=False)
    monkeypatch.setattr(build_mod, "write_meta", boom)
    with pytest.raises(RuntimeError):
        _small(seed=5)[0].save(tmp_path / "keep", overwrite=True, progress=False)
    assert GraphStore.open(tmp_path / "keep").version == g.version
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda m: m.pop("num_nodes"), r"meta\.json.*field 'num_nodes'.*required"),
        (lambda m: m.update(num_edges="many"), r"meta\.json.*field 'num_edges'"),
        (lambda m: m.update(feature_dtype="int8"), r"field 'feature_dtype'"),
        (lambda m: m.update(format_version=6), r"field 'format_version'"),
        (lambda m: m.update(format_version=5), r"format_version 5 is a store with node_types"),
        (lambda m: m.update(format_version=3), r"format_version 3 is a store with node_types"),
        (lambda m: m.update(format_version=4), r"format_version 4 is a store with node_types"),
        (lambda m: m.update(has_type_node_ids=True), r"has_type_node_ids needs node_types"),
        (lambda m: m.update(ordering="metis"), r"field 'ordering'"),
        (lambda m: m.update(num_nodes=31), r"indptr\.npy: shape \[31\], expected \[32\]"),
    ],
)
def test_bad_meta_names_file_and_field(tmp_path, mutate, match):
    g, *_ = _small()
    g.save(tmp_path / "g", progress=False)
    path = tmp_path / "g" / "meta.json"
    meta = json.loads(path.read_text())
    mutate(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(GraphFormatError, match=match):
        GraphStore.open(tmp_path / "g")


def test_missing_files(tmp_path):
    with pytest.raises(GraphFormatError, match="not a directory"):
        GraphStore.open(tmp_path / "nope")
    g, *_ = _small()
    g.save(tmp_path / "g", progress=False)
    (tmp_path / "g" / "features.npy").unlink()
    with pytest.raises(GraphFormatError, match=r"features\.npy: missing"):
        GraphStore.open(tmp_path / "g")
    (tmp_path / "g" / "meta.json").write_text("{not json")
    with pytest.raises(GraphFormatError, match=r"meta\.json: cannot read"):
        GraphStore.open(tmp_path / "g")
    (tmp_path / "g" / "meta.json").unlink()
    with pytest.raises(GraphFormatError, match=r"meta\.json: missing"):
        GraphStore.open(tmp_path / "g")


def test_wrong_array_dtype(tmp_path):
    g, *_ = _small()
    g.save(tmp_path / "g", progress=False)
    np.save(tmp_path / "g" / "indices.npy", g.indices.numpy().astype(np.int64))
    with pytest.raises(GraphFormatError, match=r"indices\.npy: dtype int64, expected int32"):
        GraphStore.open(tmp_path / "g")
