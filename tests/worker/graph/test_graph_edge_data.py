"""Edge weights and edge features in the graph store: aligned through the CSC sort and the
RCMK reorder, versioned, saved and reopened, refused where the builder cannot keep them."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.graph import GraphFormatError, GraphStore, GraphTopology
from hopserve.worker.graph.format import EDGE_FEATURES_FILE, EDGE_WEIGHT_FILE


def _graph(seed: int, n: int = 20, e: int = 70, d_e: int = 3, isolated: int = 3):
    rng = np.random.default_rng(seed)
    active = max(1, n - isolated)
    ei = rng.integers(0, active, (2, e))
    ei = np.concatenate([ei, ei[:, :7]], axis=1)  # parallel edges (with other weights)
    w = rng.uniform(0.1, 2.0, ei.shape[1]).astype(np.float32)
    ea = rng.standard_normal((ei.shape[1], d_e)).astype(np.float32)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return torch.from_numpy(ei), torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(ea)


def _rows(src, dst, w, ea) -> Counter:
    """The multiset of (src, dst, weight, features) rows (exact float bits)."""
    return Counter(
        (int(s), int(d), float(a), tuple(float(v) for v in f))
        for s, d, a, f in zip(src, dst, w, ea, strict=True)
    )


def _stored_rows(g: GraphStore) -> Counter:
    ext = g.to_external(g.edge_index())
    return _rows(ext[0], ext[1], g.edge_weight, g.edge_features)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 30),
    e=st.integers(0, 80),
    reorder=st.sampled_from(["rcmk", None]),
)
def test_edge_columns_follow_their_edges(seed, n, e, reorder):
    ei, x, w, ea = _graph(seed, n=n, e=e, isolated=min(3, n - 1))
    g = GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea, reorder=reorder)
    assert g.edge_weight.dtype == torch.float32 and g.edge_weight.shape == (g.num_edges,)
    assert g.edge_features.shape == (g.num_edges, 3)
    assert _stored_rows(g) == _rows(ei[0], ei[1], w, ea)
    # CSC segments stay ascending by source, parallel edges in their input order
    ext = g.to_external(g.edge_index())
    for s, d in {(int(a), int(b)) for a, b in ei.T.tolist()}:
        given_w = [float(w[k]) for k in range(ei.shape[1]) if (ei[0, k], ei[1, k]) == (s, d)]
        at = ((ext[0] == s) & (ext[1] == d)).nonzero().squeeze(1)
        assert [float(g.edge_weight[k]) for k in at] == given_w


def test_save_open_round_trip_and_version(tmp_path):
    ei, x, w, ea = _graph(1)
    g = GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea)
    g.save(tmp_path / "g", progress=False)
    h = GraphStore.open(tmp_path / "g")
    assert h.version == g.version and h.meta.format_version == 2
    assert h.meta.has_edge_weight and h.meta.edge_feature_dim == 3
    assert torch.equal(h.edge_weight, g.edge_weight)
    assert torch.equal(h.edge_features, g.edge_features)
    topo = GraphTopology.open(tmp_path / "g")
    assert topo.has_edge_data and np.array_equal(topo.edge_weight, g.edge_weight.numpy())
    # the content hash covers each column
    w2 = w.clone()
    w2[0] += 1
    assert GraphStore.from_edge_index(ei, x, edge_weight=w2, edge_attr=ea).version != g.version
    ea2 = ea.clone()
    ea2[3, 1] = 0.5
    assert GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea2).version != g.version
    only_w = GraphStore.from_edge_index(ei, x, edge_weight=w)
    assert only_w.edge_features is None and only_w.version != g.version
    plain = GraphStore.from_edge_index(ei, x)
    assert len({plain.version, only_w.version}) == 2


def test_store_without_edge_data_is_format_1_unchanged(tmp_path):
    ei, x, *_ = _graph(2)
    g = GraphStore.from_edge_index(ei, x)
    assert g.edge_weight is None and g.edge_features is None
    assert not g.topology.has_edge_data
    g.save(tmp_path / "g", progress=False)
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    assert meta["format_version"] == 1
    assert "has_edge_weight" not in meta and "edge_feature_dim" not in meta
    assert not (tmp_path / "g" / EDGE_WEIGHT_FILE).exists()
    h = GraphStore.open(tmp_path / "g")
    assert h.version == g.version and h.edge_weight is None


def test_edge_file_missing_or_wrong_shape_is_refused(tmp_path):
    ei, x, w, ea = _graph(3)
    GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea).save(
        tmp_path / "g", progress=False
    )
    np.save(tmp_path / "g" / EDGE_FEATURES_FILE, np.zeros((ei.shape[1], 2), np.float32))
    with pytest.raises(GraphFormatError, match=r"edge_features\.npy: shape"):
        GraphStore.open(tmp_path / "g")
    (tmp_path / "g" / EDGE_WEIGHT_FILE).unlink()
    with pytest.raises(GraphFormatError, match=r"edge_weight\.npy: missing"):
        GraphStore.open(tmp_path / "g")


@pytest.mark.parametrize("option", ["add_self_loops", "dedup"])
def test_transforms_that_invent_or_merge_edges_are_refused(option):
    ei, x, w, _ = _graph(4)
    with pytest.raises(ValueError, match="cannot be combined with edge weights"):
        GraphStore.from_edge_index(ei, x, edge_weight=w, **{option: True})


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), e=st.integers(0, 40))
def test_symmetrize_copies_the_data_of_the_mirrored_edge(seed, n, e):
    """Each added reverse edge carries its mirror's data; the structure is the one
    symmetrize builds without edge data (max(A, A^T))."""
    ei, x, w, ea = _graph(seed, n=n, e=e, isolated=0)
    g = GraphStore.from_edge_index(ei, x, edge_weight=w, edge_attr=ea, symmetrize=True)
    plain = GraphStore.from_edge_index(ei, x, symmetrize=True)
    assert torch.equal(g.indptr, plain.indptr) and torch.equal(g.indices, plain.indices)
    rows = _rows(ei[0], ei[1], w, ea)
    pairs = Counter((int(s), int(d)) for s, d in ei.T.tolist())
    for s, d in sorted(pairs):
        if s == d or pairs[(s, d)] <= pairs[(d, s)]:
            continue
        at = [k for k in range(ei.shape[1]) if (int(ei[0, k]), int(ei[1, k])) == (s, d)]
        for k in at[pairs[(d, s)] :]:  # the surplus copies, in input order
            rows[(d, s, float(w[k]), tuple(float(v) for v in ea[k]))] += 1
    assert _stored_rows(g) == rows


def test_bad_edge_data_names_the_edge():
    ei, x, w, ea = _graph(5)
    w[9] = float("nan")
    with pytest.raises(ValueError, match=r"edge_weight of edge 9 is not finite"):
        GraphStore.from_edge_index(ei, x, edge_weight=w)
    ea[4, 2] = float("inf")
    with pytest.raises(ValueError, match=r"edge_features of edge 4 is not finite"):
        GraphStore.from_edge_index(ei, x, edge_attr=ea)
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[77\]"):
        GraphStore.from_edge_index(ei, x, edge_weight=torch.ones(5))


def test_from_pyg_takes_edge_weight_and_edge_attr():
    pyg_data = pytest.importorskip("torch_geometric.data")
    ei, x, w, ea = _graph(6)
    data = pyg_data.Data(x=x, edge_index=ei, edge_weight=w, edge_attr=ea)
    g = GraphStore.from_pyg(data)
    assert _stored_rows(g) == _rows(ei[0], ei[1], w, ea)
    assert GraphStore.from_pyg(data, edge_data=False).edge_weight is None
    one = GraphStore.from_pyg(pyg_data.Data(x=x, edge_index=ei, edge_attr=w))
    assert one.edge_weight is None and one.edge_features.shape == (ei.shape[1], 1)
