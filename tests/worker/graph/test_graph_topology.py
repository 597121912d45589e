"""GraphTopology: a store's structure and ID map, numpy only, shared zero-copy with GraphStore."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from support import random_edge_index

from hopserve import GraphStore
from hopserve.worker.graph import GraphTopology, UnknownNodeError


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
    n = 50
    ids = torch.from_numpy(np.arange(n, dtype=np.int64) * 3 + 100)
    store = GraphStore.from_edge_index(random_edge_index(n, 200), torch.randn(n, 4), node_ids=ids)
    path = tmp_path_factory.mktemp("topo") / "g"
    store.save(path, progress=False)
    return store, path


def test_topology_matches_the_store(saved) -> None:
    store, path = saved
    topo = GraphTopology.open(path)
    assert (topo.num_nodes, topo.num_edges, topo.version) == (
        store.num_nodes,
        store.num_edges,
        store.version,
    )
    np.testing.assert_array_equal(topo.indptr, store.indptr.numpy())
    np.testing.assert_array_equal(topo.in_degrees, store.in_degrees.numpy())
    np.testing.assert_array_equal(topo.out_degrees, store.out_degrees.numpy())
    np.testing.assert_array_equal(topo.edge_index(), store.edge_index().numpy())
    ext = np.array([103, 100, 247])
    np.testing.assert_array_equal(topo.to_storage(ext), store.to_storage(ext).numpy())
    np.testing.assert_array_equal(topo.to_external(topo.to_storage(ext)), ext)
    with pytest.raises(UnknownNodeError):
        topo.to_storage([101])


def test_the_store_shares_the_topology_arrays(saved) -> None:
    _, path = saved
    store = GraphStore.open(path)
    assert np.shares_memory(store.indptr.numpy(), store.topology.indptr)
    assert np.shares_memory(store.indices.numpy(), store.topology.indices)


def test_opening_a_topology_does_not_import_torch(saved) -> None:
    _, path = saved
    code = (
        "import sys; from hopserve.worker.graph import GraphTopology; "
        f"t = GraphTopology.open({str(path)!r}); t.to_storage([100]); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
