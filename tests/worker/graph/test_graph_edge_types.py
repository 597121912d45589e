"""Typed edges in the graph store: the ``edge_type`` column (relation ids, int16, CSC order)
follows its edges through the CSC sort and the RCMK reorder, ``relations`` names the ids,
saved and reopened with the same version; bad relation ids and names are refused naming
the edge or the name."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopserve.worker.graph import GraphFormatError, GraphStore, GraphTopology
from hopserve.worker.graph.format import EDGE_TYPE_FILE
from hopserve.worker.graph.relations import MAX_RELATIONS, relation_ids, validate_edge_type


def _typed(seed: int, n: int = 20, e: int = 70, relations: int = 3, isolated: int = 3):
    """Random typed edges, some ``(src, dst)`` pairs repeated under other relations."""
    rng = np.random.default_rng(seed)
    active = max(1, n - isolated)
    ei = rng.integers(0, active, (2, e))
    ei = np.concatenate([ei, ei[:, :7]], axis=1)
    et = rng.integers(0, relations, ei.shape[1])
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return torch.from_numpy(ei), torch.from_numpy(x), torch.from_numpy(et)


def _stored(g: GraphStore) -> Counter:
    ext = g.to_external(g.edge_index())
    return Counter(zip(ext[0].tolist(), ext[1].tolist(), g.edge_type.tolist(), strict=True))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 30),
    e=st.integers(0, 80),
    reorder=st.sampled_from(["rcmk", None]),
    symmetrize=st.booleans(),
)
def test_edge_types_follow_their_edges(seed, n, e, reorder, symmetrize):
    ei, x, et = _typed(seed, n=n, e=e, isolated=min(3, n - 1))
    g = GraphStore.from_edge_index(ei, x, edge_type=et, reorder=reorder, symmetrize=symmetrize)
    assert g.edge_type.dtype == torch.int16 and g.edge_type.shape == (g.num_edges,)
    count = int(et.max()) + 1 if et.numel() else 1
    assert g.relations == [str(r) for r in range(count)]
    given_rows = Counter(zip(ei[0].tolist(), ei[1].tolist(), et.tolist(), strict=True))
    stored = _stored(g)
    if not symmetrize:
        assert stored == given_rows
    else:  # every given edge is kept; added reverses carry their mirror's relation
        assert not given_rows - stored
        for (s, d, r), count in (stored - given_rows).items():
            assert given_rows[(d, s, r)] >= count


def test_relation_names_save_open_and_version(tmp_path):
    ei, x, _ = _typed(1)
    names = np.array(["clicks", "buys", "views"])[np.arange(ei.shape[1]) % 3]
    g = GraphStore.from_edge_index(ei, x, edge_type=names)
    assert g.relations == ["buys", "clicks", "views"]  # sorted names
    assert Counter(np.array(g.relations)[g.edge_type.numpy()].tolist()) == Counter(names.tolist())
    g.save(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["format_version"] == 2 and meta["relations"] == ["buys", "clicks", "views"]
    h = GraphStore.open(tmp_path / "s")
    assert h.version == g.version and h.relations == g.relations
    assert torch.equal(h.edge_type, g.edge_type)
    assert "relations=3" in repr(h)
    topo = GraphTopology.open(tmp_path / "s")
    assert topo.relations == g.relations and topo.has_edge_data
    # the relation ids are part of the content: other ids, another version
    other = GraphStore.from_edge_index(ei, x, edge_type=np.roll(names, 1))
    assert other.version != g.version
    untyped = GraphStore.from_edge_index(ei, x)
    assert untyped.edge_type is None and untyped.relations is None
    assert untyped.meta.format_version == 1


def test_given_names_fix_the_ids_and_unknown_names_are_refused():
    ids, names = relation_ids(["b", "a", "b"], ["b", "a", "c"])
    assert ids.tolist() == [0, 1, 0] and names == ["b", "a", "c"]
    with pytest.raises(ValueError, match="unknown relation 'z'"):
        relation_ids(["a", "z"], ["a", "b"])
    with pytest.raises(ValueError, match="'a' is repeated"):
        relation_ids([0, 1], ["a", "a"])
    ids, names = relation_ids(np.array([2, 0], dtype=np.int64))
    assert names == ["0", "1", "2"] and ids.dtype == np.int16


@pytest.mark.parametrize(
    ("types", "match"),
    [
        (np.array([0, 1, -1]), "edge_type of edge 2 is -1"),
        (np.array([0.0, 1.0, 1.0]), "integer relation ids, got dtype float64"),
        (np.array([0, 1]), r"shape \[3\]"),
        (np.array([0, MAX_RELATIONS, 0]), f"edge_type of edge 1 is {MAX_RELATIONS}"),
    ],
)
def test_bad_relation_ids_name_the_edge(types, match):
    with pytest.raises(ValueError, match=match):
        validate_edge_type(types, 3)
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match=match):
        GraphStore.from_edge_index(ei, torch.randn(3, 2), edge_type=types)


def test_ids_beyond_the_given_names_are_refused():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match="edge 2 is 2, outside the relation ids 0..1"):
        GraphStore.from_edge_index(ei, torch.randn(3, 2), edge_type=[0, 1, 2], relations=["a", "b"])
    with pytest.raises(ValueError, match="relations names the values of edge_type"):
        GraphStore.from_edge_index(ei, torch.randn(3, 2), relations=["a"])


def test_missing_or_wrong_edge_type_file_is_refused(tmp_path):
    ei, x, et = _typed(2)
    GraphStore.from_edge_index(ei, x, edge_type=et).save(tmp_path / "s")
    np.save(tmp_path / "s" / EDGE_TYPE_FILE, np.zeros(3, dtype=np.int16))
    with pytest.raises(GraphFormatError, match="edge_type.npy"):
        GraphStore.open(tmp_path / "s")
    (tmp_path / "s" / EDGE_TYPE_FILE).unlink()
    with pytest.raises(GraphFormatError, match="edge_type.npy: missing"):
        GraphStore.open(tmp_path / "s")


def test_from_pyg_takes_edge_type():
    from torch_geometric.data import Data

    ei, x, et = _typed(3)
    g = GraphStore.from_pyg(Data(x=x, edge_index=ei, edge_type=et))
    assert _stored(g) == Counter(zip(ei[0].tolist(), ei[1].tolist(), et.tolist(), strict=True))
    assert (
        GraphStore.from_pyg(Data(x=x, edge_index=ei, edge_type=et), edge_data=False).relations
        is None
    )
