"""Updates that carry edge data on a living graph holding edge weights and edge features.

Against a naive model (each edge pair -> the multiset of its data rows): after random
batches with removals of edges that carry data, duplicate edges and self-loops, every
edge of the snapshot holds its own weight and feature row (the columns are spliced with
the CSC); a process replaying the log, a compaction and a worker process catching up
from the log file all give the same arrays; each refusal leaves nothing applied; a log
record written before edge data existed still decodes.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from support.live_graph import NaiveGraph, edge_data_batch

from hopserve.worker.graph import GraphStore
from hopserve.worker.graph.live import InvalidUpdateError, LiveGraph, MutationBatch
from hopserve.worker.graph.live.mutations import ResolvedBatch, decode, encode, resolve
from hopserve.worker.graph.live.snapshot import GraphSnapshot, apply_batch

DIM, D_E, N = 4, 3, 40
TESTS = Path(__file__).resolve().parents[4]


def _store(path: Path, *, weight: bool = True, features: bool = True, seed: int = 0) -> Path:
    """A store with sparse external IDs, parallel edges, self-loops and edge data."""
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, N, (2, 160))
    ei = np.concatenate([ei, ei[:, :10], np.stack([np.arange(5), np.arange(5)])], axis=1)
    e = ei.shape[1]
    GraphStore.from_edge_index(
        torch.from_numpy(ei),
        torch.from_numpy(rng.standard_normal((N, DIM)).astype(np.float32)),
        node_ids=torch.from_numpy(rng.choice(np.arange(-50, 900), N, replace=False)),
        edge_weight=torch.rand(e) + 0.1 if weight else None,
        edge_attr=torch.randn(e, D_E) if features else None,
    ).save(path, progress=False)
    return path


@pytest.fixture
def edata_dir(tmp_path):
    return _store(tmp_path / "graph")


def edge_rows(snap) -> dict[tuple[int, int], Counter]:
    """``(src, dst)`` external IDs -> the multiset of its edges' data rows."""
    ext = snap.to_external(np.arange(snap.num_nodes))
    ei = snap.edge_index()
    w = np.zeros(ei.shape[1], np.float32) if snap.edge_weight is None else snap.edge_weight
    f = np.zeros((ei.shape[1], 0), np.float32) if snap.edge_features is None else snap.edge_features
    out: dict[tuple[int, int], Counter] = {}
    for k, (s, d) in enumerate(zip(ext[ei[0]].tolist(), ext[ei[1]].tolist(), strict=True)):
        out.setdefault((s, d), Counter())[(float(w[k]), *f[k].tolist())] += 1
    return out


def apply_naive(rows: dict, batch: MutationBatch) -> None:
    """The batch's meaning for the edge data (removals first: every copy goes)."""
    for s, d in zip(batch.remove_src.tolist(), batch.remove_dst.tolist(), strict=True):
        rows.pop((s, d), None)
    for i, (s, d) in enumerate(zip(batch.add_src.tolist(), batch.add_dst.tolist(), strict=True)):
        row = (float(batch.add_edge_weight[i]), *batch.add_edge_features[i].tolist())
        rows.setdefault((s, d), Counter())[row] += 1


def arrays(snap) -> tuple[np.ndarray, ...]:
    return (
        np.asarray(snap.indptr), np.asarray(snap.indices),
        np.asarray(snap.edge_weight), np.asarray(snap.edge_features),
    )  # fmt: skip


def assert_same_arrays(got, want, what: str) -> None:
    for name, a, b in zip(("indptr", "indices", "weight", "features"), got, want, strict=True):
        assert np.array_equal(a, b), f"{what}: {name}"


def test_each_edge_keeps_its_data_through_batches(edata_dir):
    live = LiveGraph(edata_dir, with_features=True)
    want = edge_rows(live.topology)
    g = NaiveGraph.of_snapshot(live.topology)
    rng = random.Random(7)
    removed_with_data = 0
    for _ in range(12):
        batch = edge_data_batch(rng, g, DIM, D_E)
        removed_with_data += batch.remove_src.size
        live.apply(batch)
        g.apply(batch)
        apply_naive(want, batch)
        snap = live.topology
        assert snap.edge_weight.shape == (snap.num_edges,)
        assert snap.edge_features.shape == (snap.num_edges, D_E)
        assert edge_rows(snap) == want, f"sequence {snap.seq}"
    assert removed_with_data > 0
    assert any(sum(c.values()) > 1 for c in want.values())  # parallel edges
    assert any(s == d for s, d in want)  # self-loops


def test_replay_compaction_and_catch_up_give_the_same_columns(edata_dir):
    behind = LiveGraph(edata_dir, with_features=True)  # opened now, catches up later
    live = LiveGraph(edata_dir, with_features=True)
    g = NaiveGraph.of_snapshot(live.topology)
    rng = random.Random(11)
    for _ in range(5):
        batch = edge_data_batch(rng, g, DIM, D_E)
        live.apply(batch)
        g.apply(batch)
    want = arrays(live.topology)
    assert_same_arrays(arrays(LiveGraph(edata_dir).topology), want, "replayed from the log")
    with behind.reading(live.seq) as snap:
        assert_same_arrays(arrays(snap), want, "caught up from the log")

    assert live.compact() == 5
    compacted = LiveGraph(edata_dir, with_features=True)
    assert compacted.base_seq == 5 and len(compacted.log) == 0
    assert_same_arrays(arrays(compacted.topology), want, "the compacted base")
    assert isinstance(compacted.topology.edge_weight, np.memmap)  # read from the new base

    for _ in range(3):  # more batches on the compacted base
        batch = edge_data_batch(rng, g, DIM, D_E)
        live.apply(batch)
        g.apply(batch)
    want = arrays(live.topology)
    out = edata_dir.parent / "child.npz"
    script = (
        "import sys, numpy as np\n"
        "from hopserve.worker.graph.live import open_live\n"
        "live = open_live(sys.argv[1], with_features=True)\n"
        "with live.reading(int(sys.argv[2])) as s:\n"
        "    np.savez(sys.argv[3], indptr=s.indptr, indices=s.indices,\n"
        "             weight=s.edge_weight, features=s.edge_features)\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(edata_dir), str(live.seq), str(out)],
        check=True, cwd=TESTS, timeout=120,
    )  # fmt: skip
    with np.load(out) as child:
        got = (child["indptr"], child["indices"], child["weight"], child["features"])
    assert_same_arrays(got, want, "a worker process catching up from the log")


def _weights(k: int) -> np.ndarray:
    return np.linspace(0.5, 1.5, k, dtype=np.float32)


def _feats(k: int, width: int = D_E) -> np.ndarray:
    return np.ones((k, width), np.float32)


@pytest.mark.parametrize(
    ("columns", "edge_data", "message"),
    [
        ({}, {"add_edge_features": _feats(3)}, r"add_edges.weights: .*3 added edge\(s\) were given none"),
        ({}, {"add_edge_weight": _weights(3)}, r"add_edges.features: .*3 edge features per edge, but the 3 added"),
        ({}, {"add_edge_weight": _weights(3), "add_edge_features": _feats(3, 2)},
         r"add_edges.features: width 2 given, the graph's edge feature width is 3"),
        ({}, {"add_edge_weight": np.array([1, np.nan, 1], np.float32), "add_edge_features": _feats(3)},
         r"add_edges.weights\[1\]: the weight of edge 1 is NaN or Inf"),
        ({}, {"add_edge_weight": _weights(3), "add_edge_features": np.where(np.eye(3, 3) > 0, np.inf, 0)},
         r"add_edges.features\[0\]: the features of edge 0 hold NaN or Inf"),
        ({}, {"add_edge_weight": _weights(2), "add_edge_features": _feats(3)},
         r"add_edges.weights: shape \[2\], expected one weight per added edge \[3\]"),
        ({"weight": False}, {"add_edge_weight": _weights(3), "add_edge_features": _feats(3)},
         r"add_edges.weights: the graph holds no edge weights, but 3 were given"),
        ({"features": False}, {"add_edge_weight": _weights(3), "add_edge_features": _feats(3)},
         r"add_edges.features: the graph holds no edge features, but 3 row\(s\)"),
    ],
    ids=["no weights", "no features", "feature width", "NaN weight", "inf features",
         "weight count", "weights, no column", "features, no column"],
)  # fmt: skip
def test_bad_edge_data_is_refused_and_nothing_applied(tmp_path, columns, edge_data, message):
    path = _store(tmp_path / "g", **columns)
    live = LiveGraph(path, with_features=True)
    ids = live.topology.to_external(np.arange(4))
    before = arrays(live.topology) if live.topology.has_edge_data else None
    nodes, edges, log_len = live.topology.num_nodes, live.topology.num_edges, len(live.log)
    batch = MutationBatch(
        add_node_ids=[5000], add_node_features=np.ones((1, DIM), np.float32),
        add_src=[ids[0], ids[1], 5000], add_dst=[ids[2], ids[2], ids[3]], **edge_data,
    )  # fmt: skip
    with pytest.raises(InvalidUpdateError, match=message):
        live.apply(batch)
    topo = live.topology
    assert (live.seq, topo.num_nodes, topo.num_edges, len(live.log)) == (0, nodes, edges, log_len)
    if before is not None:
        assert_same_arrays(arrays(topo), before, "after a refused batch")
    reopened = LiveGraph(path)
    assert reopened.seq == 0  # nothing logged either


def test_removals_need_no_data_and_node_only_batches_keep_the_columns(edata_dir):
    live = LiveGraph(edata_dir, with_features=True)
    snap = live.topology
    ext = snap.to_external(np.arange(snap.num_nodes))
    ei = snap.edge_index()
    pair = (int(ext[ei[0, 0]]), int(ext[ei[1, 0]]))
    copies = sum(edge_rows(snap)[pair].values())
    live.apply(MutationBatch(remove_src=[pair[0]], remove_dst=[pair[1]]))
    assert live.topology.num_edges == snap.num_edges - copies
    assert pair not in edge_rows(live.topology)
    before = arrays(live.topology)
    live.apply(MutationBatch(add_node_ids=[7777], add_node_features=np.ones((1, DIM), np.float32)))
    after = arrays(live.topology)
    assert np.array_equal(after[0][:-1], before[0]) and after[0][-1] == before[0][-1]
    assert_same_arrays((before[0], *after[1:]), before, "a batch adding only nodes")


def test_apply_batch_refuses_a_batch_without_the_graphs_edge_data(edata_dir):
    """The splice's own guard: a resolved batch that lacks a column the graph holds (or
    carries one it lacks) is refused rather than misaligning the columns."""
    snap = GraphSnapshot.of(GraphStore.open(edata_dir).topology)
    ids = snap.to_external(np.arange(2))
    ok = resolve(
        MutationBatch(add_src=ids[:1], add_dst=ids[1:], add_edge_weight=[1.0],
                      add_edge_features=_feats(1)), snap, 1,
    )  # fmt: skip
    assert apply_batch(snap, ok).num_edges == snap.num_edges + 1
    for field in ("add_edge_weight", "add_edge_features"):
        bad = ResolvedBatch(**{**ok.__dict__, field: None})
        with pytest.raises(InvalidUpdateError, match=field):
            apply_batch(snap, bad)


# ---------------------------------------------------------------------------- log bytes
OLD_RECORD = bytes.fromhex(
    "07000000000000000500000000000000020000006b3101010000000000000000000000000000002a"
    "0000000000000002010000000000000002000000000000000000003f000080bf0101000000000000"
    "00000000000000000001000000000000000101000000000000000000000000000000020000000000"
    "00000102000000000000000000000000000000050000000000000000000000000000000102000000"
    "00000000000000000000000003000000000000000500000000000000010100000000000000000000"
    "0000000000040000000000000002010000000000000002000000000000000000004000004040"
)
"""A batch encoded before updates carried edge data (``encode`` at commit 908264e)."""


def test_a_record_in_the_old_encoding_decodes():
    batch = decode(OLD_RECORD, 2)
    assert (batch.seq, batch.num_nodes_before, batch.idempotency_key) == (7, 5, "k1")
    assert batch.new_node_ids.tolist() == [42]
    assert batch.new_features.tolist() == [[0.5, -1.0]]
    assert (batch.remove_src.tolist(), batch.remove_dst.tolist()) == ([1], [2])
    assert (batch.add_src.tolist(), batch.add_dst.tolist()) == ([5, 0], [3, 5])
    assert batch.set_nodes.tolist() == [4] and batch.set_features.tolist() == [[2.0, 3.0]]
    assert batch.add_edge_weight is None and batch.add_edge_features is None
    assert encode(batch) == OLD_RECORD  # a batch without edge data encodes as before


def test_edge_data_round_trips_through_the_log_bytes():
    old = decode(OLD_RECORD, 2)
    for weight, feats in [
        (np.array([0.25, 4.0], np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)),
        (np.array([0.25, 4.0], np.float32), None),
        (None, np.arange(6, dtype=np.float32).reshape(2, 3)),
    ]:
        batch = ResolvedBatch(**{**old.__dict__, "add_edge_weight": weight,
                                 "add_edge_features": feats})  # fmt: skip
        data = encode(batch)
        back = decode(data, 2)
        for field, want in (("add_edge_weight", weight), ("add_edge_features", feats)):
            got = getattr(back, field)
            assert (got is None) == (want is None) and (want is None or np.array_equal(got, want))
        for cut in (1, 5, len(data) - len(OLD_RECORD) - 1):
            with pytest.raises(ValueError, match="log record"):
                decode(data[:-cut], 2)
    empty = ResolvedBatch(**{**old.__dict__, "add_src": old.add_src[:0], "add_dst": old.add_dst[:0],
                             "add_edge_weight": np.zeros(0, np.float32),
                             "add_edge_features": np.zeros((0, 3), np.float32)})  # fmt: skip
    back = decode(encode(empty), 2)
    assert back.add_edge_weight.shape == (0,) and back.add_edge_features.shape == (0, 3)
