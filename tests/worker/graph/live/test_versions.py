"""Jobs planned before an update: a recent version still runs exactly, unless a batch
overwrote feature rows since (then the job is refused and planned again)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.live_graph import build_store

from hopserve.worker.graph.live import GraphSeqError, MutationBatch, forget_live, open_live
from hopserve.worker.graph.live.graph import RECENT_SNAPSHOTS


@pytest.fixture
def live(tmp_path: Path):
    path = tmp_path / "g"
    build_store([(i, (i + 1) % 8) for i in range(8)], 8, 3, id_kind="identity", path=path)
    graph = open_live(path, with_features=True)
    yield graph
    forget_live()


def test_a_recent_version_runs_on_its_own_arrays_and_rows(live) -> None:
    with live.reading(0) as snap:
        before = live.store(snap).edge_index().clone()
        rows = live.store(snap).features.clone()
    live.apply(MutationBatch(add_src=[0], add_dst=[5]))
    live.apply(MutationBatch(add_node_ids=[100], add_node_features=np.ones((1, 3))))
    with live.reading(0) as old:  # planned at 0, the graph is at 2: still exact at 0
        store = live.store(old)
        assert old.seq == 0 and store.num_nodes == 8
        assert torch.equal(store.edge_index(), before)
        assert torch.equal(store.features, rows)
    with live.reading(2) as now:
        assert live.store(now).num_edges == 9 and live.store(now).num_nodes == 9


def test_a_version_older_than_a_feature_overwrite_or_the_window_is_refused(live) -> None:
    live.apply(MutationBatch(add_src=[0], add_dst=[5]))
    live.apply(MutationBatch(set_node_ids=[3], set_features=np.zeros((1, 3))))
    with pytest.raises(GraphSeqError, match="planned at sequence 1"), live.reading(1):
        pass
    for _ in range(RECENT_SNAPSHOTS + 1):
        live.apply(MutationBatch(add_src=[1], add_dst=[6]))
    with pytest.raises(GraphSeqError, match="planned at sequence 2"), live.reading(2):
        pass
    with live.reading(live.seq - 1) as snap:  # within the window, no overwrite since
        assert snap.seq == live.seq - 1
