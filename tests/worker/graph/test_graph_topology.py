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


def test_the_out_edge_index_is_built_once_however_many_threads_ask(saved, monkeypatch) -> None:
    """Two models (or the front-end and a model) asking at once share one build, and the
    index lists each node's out-neighbours (review finding: each built its own)."""
    import threading
    import time

    from hopserve.worker.graph import topology as topology_module

    topo = GraphTopology.open(saved[1])
    built = []
    real = topology_module.build_csr

    def slow_build(*args):
        built.append(1)
        time.sleep(0.2)  # both threads arrive while the first builds
        return real(*args)

    monkeypatch.setattr(topology_module, "build_csr", slow_build)
    threads = [threading.Thread(target=topo.ensure_out_edges) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    src, dst = topo.indices.astype(np.int64), np.repeat(np.arange(topo.num_nodes), topo.in_degrees)
    for v in (0, 5, int(src[0])):
        assert sorted(topo.out_neighbours(np.array([v])).tolist()) == sorted(dst[src == v].tolist())
