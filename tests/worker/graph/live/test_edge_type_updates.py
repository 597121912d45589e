"""Updates on a living graph with typed edges (an ``edge_type`` column, relation names).

Added edges name their relation (names or ids); every edge of the snapshot keeps its
relation through batches with removals (all relations of a pair go), parallel edges under
other relations and new nodes; the log replay and a compaction give the same column and
names; a typed model served from the updated graph equals its own forward on it; a batch
without relations, with an unknown one, or with relations for an untyped graph is refused
with nothing applied.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from support import assert_exact
from support.live_graph import live_state
from torch import nn
from torch_geometric import nn as pyg

from hopserve.config import EngineConfig
from hopserve.proto.contract import Job
from hopserve.worker.graph import GraphStore
from hopserve.worker.graph.live import (
    InvalidUpdateError,
    LiveGraph,
    MutationBatch,
    forget_live,
    open_live,
)
from hopserve.worker.graph.live.mutations import decode, encode, resolve
from hopserve.worker.runtime import make_worker

DIM, N = 4, 40
NAMES = ["buys", "clicks", "views"]


def _store(path: Path, *, typed: bool = True, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, N, (2, 160))
    ei = np.concatenate([ei, ei[:, :10]], axis=1)  # parallel edges (other relations)
    GraphStore.from_edge_index(
        torch.from_numpy(ei),
        torch.from_numpy(rng.standard_normal((N, DIM)).astype(np.float32)),
        node_ids=torch.from_numpy(rng.choice(np.arange(-50, 900), N, replace=False)),
        edge_type=np.array(NAMES)[rng.integers(0, 3, ei.shape[1])] if typed else None,
    ).save(path, progress=False)
    return path


def typed_edges(snap) -> Counter:
    """The multiset of ``(src, dst, relation name)`` in external IDs."""
    ext = snap.to_external(np.arange(snap.num_nodes))
    ei = snap.edge_index()
    names = np.array(snap.meta.relations)[np.asarray(snap.edge_type)]
    return Counter(zip(ext[ei[0]].tolist(), ext[ei[1]].tolist(), names.tolist(), strict=True))


def _batch(rng: random.Random, want: Counter, ids: list[int], step: int) -> MutationBatch:
    """Remove two present pairs, add a node and six typed edges (some onto it)."""
    pairs = sorted({(s, d) for s, d, _ in want})
    gone = rng.sample(pairs, 2)
    new = 10_000 + step
    ends = [*ids, new]
    add = [(rng.choice(ends), rng.choice(ends)) for _ in range(5)] + [(new, ids[0])]
    rel = [rng.choice(NAMES) for _ in add]
    return MutationBatch(
        add_node_ids=[new],
        add_node_features=np.ones((1, DIM), np.float32),
        remove_src=[s for s, _ in gone],
        remove_dst=[d for _, d in gone],
        add_src=[s for s, _ in add],
        add_dst=[d for _, d in add],
        add_edge_type=rel,
    )


def _apply_naive(want: Counter, batch: MutationBatch) -> None:
    for s, d in zip(batch.remove_src.tolist(), batch.remove_dst.tolist(), strict=True):
        for key in [k for k in want if k[:2] == (s, d)]:
            del want[key]
    added = zip(batch.add_src.tolist(), batch.add_dst.tolist(), batch.add_edge_type, strict=True)
    for s, d, r in added:
        want[(s, d, r)] += 1


def test_each_edge_keeps_its_relation_through_replay_and_compaction(tmp_path):
    path = _store(tmp_path / "g")
    live = LiveGraph(path, with_features=True)
    want = typed_edges(live.topology)
    ids = live.topology.to_external(np.arange(N)).tolist()
    rng = random.Random(3)
    for step in range(6):
        batch = _batch(rng, want, ids, step)
        live.apply(batch)
        _apply_naive(want, batch)
        assert live.topology.edge_type.dtype == np.int16
        assert typed_edges(live.topology) == want, f"sequence {live.seq}"
    assert typed_edges(LiveGraph(path).topology) == want  # replayed from the log
    assert live.compact() == 6
    compacted = LiveGraph(path, with_features=True)
    assert compacted.topology.meta.relations == NAMES
    assert typed_edges(compacted.topology) == want
    assert live.info()["relations"] == NAMES


class RGCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg.RGCNConv(DIM, 8, len(NAMES))
        self.conv2 = pyg.RGCNConv(8, 4, len(NAMES), aggr="add")

    def forward(self, x, edge_index, edge_type):
        return self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)


def test_a_worker_serves_a_typed_model_exactly_through_updates(tmp_path):
    """Jobs on a worker (the serving path) equal a fresh forward on the naive graph."""
    path = _store(tmp_path / "g")
    live = open_live(path, with_features=True)
    worker = make_worker("cpu", worker_id="typed")
    try:
        with live.reading():
            store = live.store()
        torch.manual_seed(0)
        model = RGCN().eval()
        entry = worker.add_model("m", "1", model, store, EngineConfig())
        entry.live = live
        ids = live.topology.to_external(np.arange(N)).tolist()
        want_edges = typed_edges(live.topology)
        for step in range(4):
            batch = _batch(random.Random(step), want_edges, ids, step)
            live.apply(batch)
            _apply_naive(want_edges, batch)
            g = live_state(live)
            row = {v: i for i, v in enumerate(g.ids)}
            edges = list(want_edges.elements())
            ei = torch.tensor([[row[s] for s, _, _ in edges], [row[d] for _, d, _ in edges]])
            et = torch.tensor([NAMES.index(r) for _, _, r in edges])
            x = torch.from_numpy(np.stack([g.features[v] for v in g.ids]))
            with torch.no_grad():
                want = model(x, ei, et)
            targets = np.arange(live.topology.num_nodes, dtype=np.int64)
            job = Job(
                f"job-{step}", "m", "1", targets,
                graph_version=live.lineage_version, graph_seq=live.seq,
            )  # fmt: skip
            got = torch.from_numpy(worker.execute(job).embeddings)
            assert_exact(got, want, f"rgcn after typed batch {step}")
    finally:
        worker.close()
        forget_live(path)


@pytest.mark.parametrize(
    ("typed", "relations", "message"),
    [
        (True, None, r"add_edges.relations: the graph's edges are typed .* 2 added edge\(s\) name no relation"),
        (True, ["buys", "likes"], r"add_edges.relations: unknown relation 'likes'"),
        (True, ["buys"], r"add_edges.relations: shape \[1\], expected one relation per added edge \[2\]"),
        (True, [0, 3], r"add_edges.relations: edge_type of edge 1 is 3, outside the relation ids 0..2"),
        (False, ["buys", "views"], r"add_edges.relations: the graph has no typed edges, but 2"),
    ],
    ids=["none", "unknown", "count", "id out of range", "untyped graph"],
)  # fmt: skip
def test_bad_relations_are_refused_and_nothing_applied(tmp_path, typed, relations, message):
    live = LiveGraph(_store(tmp_path / "g", typed=typed))
    ids = live.topology.to_external(np.arange(2)).tolist()
    before = live.seq
    batch = MutationBatch(add_src=ids, add_dst=ids[::-1], add_edge_type=relations)
    with pytest.raises(InvalidUpdateError, match=message):
        live.apply(batch)
    assert live.seq == before and len(live.log) == 0


def test_relation_ids_round_trip_through_the_log_bytes(tmp_path):
    live = LiveGraph(_store(tmp_path / "g"))
    ids = live.topology.to_external(np.arange(3)).tolist()
    batch = MutationBatch(add_src=ids, add_dst=ids[::-1], add_edge_type=[2, 0, 1])
    resolved = resolve(batch, live.topology, 1)
    assert resolved.add_edge_type.tolist() == [2, 0, 1]
    back = decode(encode(resolved), DIM)
    assert back.add_edge_type.tolist() == [2, 0, 1]


def test_a_positional_typed_graph_takes_typed_edges_keeps_its_types_and_refuses_new_nodes(
    tmp_path,
):
    from hopserve.worker.graph.synth_hetero import synth_recommender

    path = tmp_path / "rec"
    synth_recommender(40, 30, 4, DIM, seed=1, out=path, progress=False)
    live = LiveGraph(path, with_features=True)
    types = {t.name: t for t in live.topology.node_types}
    user, item = types["user"].offset + 3, types["item"].offset + 7  # store-wide IDs
    before = live.topology.num_edges
    live.apply(MutationBatch(add_src=[user, item], add_dst=[item, user],
                             add_edge_type=["user__clicks__item", "item__clicked-by__user"]))  # fmt: skip
    assert live.topology.num_edges == before + 2
    refused = [
        (MutationBatch(add_src=[item], add_dst=[user], add_edge_type=["user__clicks__item"]),
         r"add_edges\[0\]: the source \d+ of a 'user__clicks__item' edge is not a 'user' node"),
        (MutationBatch(add_node_ids=[9_999], add_node_features=np.ones((1, DIM), np.float32)),
         r"add_nodes: the graph's node types \(user, item, category\) are numbered by "
         r"position 0..count-1"),
    ]  # fmt: skip
    for batch, message in refused:
        with pytest.raises(InvalidUpdateError, match=message):
            live.apply(batch)
    assert live.seq == 1
    live.compact()
    compacted = LiveGraph(path)
    assert compacted.topology.node_types == live.topology.node_types
    assert compacted.topology.meta.format_version == 3
    assert typed_edges(compacted.topology) == typed_edges(live.topology)
