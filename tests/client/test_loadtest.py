"""The load generator's ID sources (client side, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hopserve.client.loadtest import read_node_ids


def test_ids_from_a_graph_store_npy_and_text(tmp_path: Path) -> None:
    store = tmp_path / "g"
    store.mkdir()
    (store / "meta.json").write_text(json.dumps({"num_nodes": 4}))
    np.testing.assert_array_equal(read_node_ids(store), [0, 1, 2, 3])  # identity IDs
    np.save(store / "node_ids.npy", np.array([70, 10, 30]))
    np.testing.assert_array_equal(read_node_ids(store), [70, 10, 30])  # its ID map
    np.save(tmp_path / "ids.npy", np.array([5, 6], dtype=np.int32))
    assert read_node_ids(tmp_path / "ids.npy").dtype == np.int64
    (tmp_path / "ids.csv").write_text("node_id,score\n12,0.5\n\n-3,1\n")
    np.testing.assert_array_equal(read_node_ids(tmp_path / "ids.csv"), [12, -3])


def test_bad_id_files_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text("1\n2\nthree\n")
    with pytest.raises(ValueError, match=r"bad.txt:3: 'three' is not an integer"):
        read_node_ids(tmp_path / "bad.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="no integer node IDs"):
        read_node_ids(tmp_path / "empty.txt")
