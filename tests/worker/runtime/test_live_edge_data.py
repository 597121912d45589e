"""A worker serving models that read edge data from a living graph: after random update
batches whose added edges carry weights and feature rows (with removals of edges that
carry data, parallel edges and self-loops), a compaction, and a second worker process
that catches up from the update log, every job equals a fresh model's own forward on the
updated graph with its edge columns (``GCNConv`` with ``edge_weight``; ``GATConv`` and
``GATv2Conv`` with ``edge_dim``, on ``edge_attr``; ``GINEConv``, which cannot run without
it)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support import assert_exact
from support.edge_models import EdgeFeatureNet, GINENet
from support.live_graph import edge_data_batch, live_state
from support.models import WeightedGCN

from hopserve import GraphStore
from hopserve.config import EngineConfig
from hopserve.proto.contract import Job
from hopserve.worker.graph.live import forget_live, open_live
from hopserve.worker.runtime import make_worker

DIM, D_E, N = 6, 3, 120
TESTS = Path(__file__).resolve().parents[2]
FAMILIES = {
    "weighted_gcn": (lambda: WeightedGCN(DIM), "edge_weight"),
    "gat_edge_dim": (lambda: EdgeFeatureNet(DIM, D_E), "edge_features"),
    "gine": (lambda: GINENet(DIM, D_E), "edge_features"),  # no edge_attr=None default
}


@pytest.fixture()
def graph_dir(tmp_path):
    rng = np.random.default_rng(1)
    hubs = np.stack([rng.integers(0, N, 200), rng.integers(0, 4, 200)])  # in-hubs 0..3
    ei = np.concatenate([hubs, rng.integers(0, N, (2, 260)), np.stack([np.arange(6)] * 2)], 1)
    ei = np.concatenate([ei, ei[:, :20]], axis=1)  # parallel edges with their own data
    e = ei.shape[1]
    path = tmp_path / "graph"
    GraphStore.from_edge_index(
        torch.from_numpy(ei),
        torch.from_numpy(rng.standard_normal((N, DIM)).astype(np.float32)),
        node_ids=torch.from_numpy(rng.choice(np.arange(-50, 2000), N, replace=False)),
        edge_weight=torch.from_numpy(rng.uniform(0.1, 2, e).astype(np.float32)),
        edge_attr=torch.from_numpy(rng.standard_normal((e, D_E)).astype(np.float32)),
    ).save(path, progress=False)
    yield path
    forget_live(path)


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(5)
    return FAMILIES[family][0]().eval()


class EdgeOracle:
    """The graph's edges as a plain list of ``(src, dst, weight, feature row)`` by external
    ID, kept apart from the snapshot: removals drop every copy of a pair, added edges are
    appended. (Copies of one pair stay in the CSC's relative order, so PyG's choice among
    a node's several self-loops is the same.)"""

    def __init__(self, snap) -> None:
        ext = snap.to_external(np.arange(snap.num_nodes))
        ei = snap.edge_index()
        self.edges = [
            (int(ext[s]), int(ext[d]), float(snap.edge_weight[k]), snap.edge_features[k].copy())
            for k, (s, d) in enumerate(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
        ]

    def apply(self, batch) -> None:  # noqa: ANN001 - a MutationBatch
        gone = set(zip(batch.remove_src.tolist(), batch.remove_dst.tolist(), strict=True))
        self.edges = [e for e in self.edges if (e[0], e[1]) not in gone]
        for i, (s, d) in enumerate(
            zip(batch.add_src.tolist(), batch.add_dst.tolist(), strict=True)
        ):
            self.edges.append(
                (s, d, float(batch.add_edge_weight[i]), batch.add_edge_features[i].copy())
            )

    def forward(self, family: str, live, targets: np.ndarray) -> torch.Tensor:
        """A fresh model's forward on the oracle's graph (rows: storage ids ``targets``)."""
        g = live_state(live)
        row = {v: i for i, v in enumerate(g.ids)}
        x = torch.from_numpy(np.stack([g.features[v] for v in g.ids]))
        ei = torch.tensor([[row[e[0]] for e in self.edges], [row[e[1]] for e in self.edges]])
        if FAMILIES[family][1] == "edge_weight":
            data = torch.tensor([e[2] for e in self.edges], dtype=torch.float32)
        else:
            data = torch.from_numpy(np.stack([e[3] for e in self.edges]))
        with torch.no_grad():
            out = _model(family)(x, ei, data)
        return out[torch.from_numpy(np.unique(targets))]


def _job(live, entry, targets: np.ndarray, k: int) -> Job:
    return Job(
        f"job-{k}", entry.name, entry.version, np.unique(targets).astype(np.int64),
        graph_version=live.lineage_version, graph_seq=live.seq,
    )  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_jobs_are_exact_through_updates_with_edge_data(family, graph_dir):
    live = open_live(graph_dir, with_features=True)
    worker = make_worker("cpu", worker_id="edge-data")
    try:
        with live.reading():
            store = live.store()
        entry = worker.add_model("m", "1", _model(family), store, EngineConfig())
        entry.live = live
        oracle = EdgeOracle(live.topology)
        rng, pyrng = np.random.default_rng(3), random.Random(4)
        removed = 0
        for k in range(12):
            if k % 2 == 1:
                batch = edge_data_batch(pyrng, live_state(live), DIM, D_E)
                live.apply(batch)
                oracle.apply(batch)
                removed += batch.remove_src.size
            if k == 7:
                live.compact()
            n = live.topology.num_nodes
            targets = np.concatenate([[0, 1, 2, n - 1], rng.integers(0, n, 6)])
            result = worker.execute(_job(live, entry, targets, k))
            want = oracle.forward(family, live, targets)
            assert_exact(torch.from_numpy(result.embeddings), want, f"{family} job {k}")
        assert removed > 0 and live.base_seq > 0
        # the edge data matters: with the last added edges' data changed the rows differ
        base = oracle.forward(family, live, np.arange(n))
        for i in range(1, 6):
            s, d, w, f = oracle.edges[-i]
            oracle.edges[-i] = (s, d, w + 1.0, f + 1.0)
        assert (oracle.forward(family, live, np.arange(n)) - base).abs().max() > 1e-3
    finally:
        worker.close()


WORKER_PROCESS = """
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[3])
from support.edge_models import EdgeFeatureNet, GINENet
from hopserve.config import EngineConfig
from hopserve.proto.contract import Job
from hopserve.worker.graph.live import open_live
from hopserve.worker.runtime import make_worker

live = open_live(sys.argv[1], with_features=True)
worker = make_worker("cpu", worker_id="behind")
with live.reading():
    store = live.store()
torch.manual_seed(5)
entry = worker.add_model("m", "1", EdgeFeatureNet(6, 3).eval(), store, EngineConfig())
entry.live = live
print("open", live.seq, flush=True)
seq, n = (int(v) for v in sys.stdin.readline().split())
assert live.seq < seq, (live.seq, seq)  # the updates are in the log only
job = Job("behind", "m", "1", np.arange(n, dtype=np.int64),
          graph_version=live.lineage_version, graph_seq=seq)
np.save(sys.argv[2], worker.execute(job).embeddings)  # catches up from the log first
print("done", live.seq, flush=True)
worker.close()
"""


def test_a_worker_process_catches_up_from_the_log_exactly(graph_dir, tmp_path):
    family = "gat_edge_dim"
    out = tmp_path / "rows.npy"
    child = subprocess.Popen(
        [sys.executable, "-c", WORKER_PROCESS, str(graph_dir), str(out), str(TESTS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout.readline().split() == ["open", "0"]
        live = open_live(graph_dir, with_features=True)
        oracle = EdgeOracle(live.topology)
        pyrng = random.Random(9)
        for _ in range(4):
            batch = edge_data_batch(pyrng, live_state(live), DIM, D_E)
            live.apply(batch)
            oracle.apply(batch)
        n = live.topology.num_nodes
        child.stdin.write(f"{live.seq} {n}\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["done", str(live.seq)]
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
    want = oracle.forward(family, live, np.arange(n))
    assert_exact(torch.from_numpy(np.load(out)), want, "worker process caught up")
