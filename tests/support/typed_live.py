"""A small typed graph (users clicking items) as tests keep it, and a deterministic stream
of typed batches adding nodes, for the typed live-update and crash tests.

:class:`TypedGraph` holds per-type own IDs and feature rows in position order and edges
as ``(relation index, source ID, destination ID)``; :func:`typed_stream_batch` is batch
``seq`` of the stream (it depends on ``seq`` only, so a writer and a checker agree), and
:func:`apply_typed_stream` applies the same batch to a :class:`TypedGraph`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch_geometric.data import HeteroData

from hopserve import GraphStore
from hopserve.worker.graph.live import MutationBatch

DIMS = {"user": 3, "item": 5}
OWN = {"user": np.arange(30) * 1000 + 7, "item": np.r_[7, np.arange(19, 0, -1) * 3]}
RELATIONS = [("user", "clicks", "item"), ("item", "clicked_by", "user")]
CLICKS, BACK = (f"{s}__{r}__{d}" for s, r, d in RELATIONS)


class TypedGraph:
    """The graph as a test keeps it: per-type own IDs and feature rows in position order,
    edges as ``(relation index, source ID, destination ID)``."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.ids = {t: list(map(int, OWN[t])) for t in DIMS}
        self.x = {
            t: rng.standard_normal((len(OWN[t]), d)).astype(np.float32) for t, d in DIMS.items()
        }
        pairs = zip(rng.integers(0, 30, 90).tolist(), rng.integers(0, 20, 90).tolist(), strict=True)
        self.edges = Counter()
        self.click([(self.ids["user"][u], self.ids["item"][i]) for u, i in pairs])

    def click(self, pairs: list[tuple[int, int]]) -> None:
        for u, i in pairs:
            self.edges[(0, u, i)] += 1
            self.edges[(1, i, u)] += 1

    def store(self) -> GraphStore:
        data = self.hetero()
        return GraphStore.from_hetero(
            data.x_dict,
            data.edge_index_dict,
            node_ids_dict={t: np.array(v) for t, v in self.ids.items()},
        )

    def hetero(self) -> HeteroData:
        data = HeteroData()
        pos = {t: {v: k for k, v in enumerate(ids)} for t, ids in self.ids.items()}
        for t in DIMS:
            data[t].x = torch.from_numpy(self.x[t])
        for r, (src, _, dst) in enumerate(RELATIONS):
            ends = [(pos[src][s], pos[dst][d]) for (q, s, d) in self.edges.elements() if q == r]
            data[RELATIONS[r]].edge_index = torch.tensor(ends, dtype=torch.long).reshape(-1, 2).T
        return data

    def add(self, node_type: str, ids: list[int], rows: np.ndarray) -> None:
        self.ids[node_type] += ids
        self.x[node_type] = np.concatenate([self.x[node_type], rows[:, : DIMS[node_type]]])


def click_batch(pairs: list[tuple[int, int]], **kw) -> MutationBatch:
    """Clicks ``(user ID, item ID)`` and their reverses as one batch (plus ``kw``)."""
    users, items = [u for u, _ in pairs], [i for _, i in pairs]
    return MutationBatch(
        add_src=users + items,
        add_dst=items + users,
        add_edge_type=[CLICKS] * len(pairs) + [BACK] * len(pairs),
        **kw,
    )


def typed_edges(topo) -> Counter:
    """``(relation index, source ID, destination ID)`` of every edge, by own IDs."""
    own = np.asarray(topo.type_node_ids)
    ei = topo.edge_index()
    rel = np.asarray(topo.edge_type).tolist()
    return Counter(zip(rel, own[ei[0]].tolist(), own[ei[1]].tolist(), strict=True))


def _stream_step(seq: int) -> tuple[str, list[int], np.ndarray, list[tuple[int, int]], int]:
    """Batch ``seq``'s new nodes: ``(type, own IDs, rows at the type's width, clicks
    (user ID, item ID), a node added two batches ago whose features it sets (0: none))``."""
    rng = np.random.default_rng(1000 + seq)
    node_type = "user" if seq % 2 else "item"
    ids = [900_000 + 10 * seq, 900_001 + 10 * seq]
    rows = rng.standard_normal((2, DIMS[node_type])).astype(np.float32)
    users, items = rng.integers(0, 30, 3), rng.integers(0, 20, 3)
    old = [(int(OWN["user"][u]), int(OWN["item"][i])) for u, i in zip(users, items, strict=True)]
    if node_type == "user":
        new = [(ids[0], int(OWN["item"][1])), (ids[1], int(OWN["item"][4]))]
    else:
        new = [(int(OWN["user"][2]), ids[0]), (int(OWN["user"][3]), ids[1])]
    return node_type, ids, rows, old + new, seq - 2


def typed_stream_batch(seq: int) -> MutationBatch:
    """Batch ``seq`` (from 1): two new nodes of one type (users on odd sequences, items on
    even ones) with clicks naming them and old nodes; from ``seq`` 3 on, it also sets the
    features of the first node batch ``seq - 2`` added (of the same type)."""
    node_type, ids, rows, pairs, earlier = _stream_step(seq)
    kw = {}
    if earlier >= 1:
        row = np.zeros((1, max(DIMS.values())), np.float32)  # the graph's width
        row[0, : DIMS[node_type]] = float(seq)
        kw = {
            "set_node_ids": [900_000 + 10 * earlier],
            "set_features": row,
            "set_node_type": node_type,
        }
    return click_batch(
        pairs, add_node_ids=ids, add_node_features=rows, add_node_type=node_type, **kw
    )


def apply_typed_stream(g: TypedGraph, seq: int) -> None:
    """What :func:`typed_stream_batch` ``(seq)`` does, on ``g``."""
    node_type, ids, rows, pairs, earlier = _stream_step(seq)
    g.add(node_type, ids, rows)
    g.click(pairs)
    if earlier >= 1:
        g.x[node_type][g.ids[node_type].index(900_000 + 10 * earlier)] = float(seq)


TYPED_CHILD = "from support.typed_live import typed_child_main; typed_child_main()"
"""``python -c TYPED_CHILD PATH SEED MODE UPTO`` (``tests/`` on ``sys.path``; SEED unused)."""


def typed_child_main() -> None:
    """A writer process for the typed crash test: applies the typed stream to the living
    graph at ``PATH`` from its sequence up to ``UPTO``, printing ``ack <seq>`` the moment
    each ``apply`` returns; ``MODE`` ``compact`` compacts after every batch (printing
    ``compacted <seq>``)."""
    import sys

    from hopserve.worker.graph.live import LiveGraph

    path, mode, upto = sys.argv[1], sys.argv[3], int(sys.argv[4])
    live = LiveGraph(path, with_features=True)
    print(f"open {live.seq}", flush=True)
    while live.seq < upto:
        result = live.apply(typed_stream_batch(live.seq + 1))
        print(f"ack {result.seq}", flush=True)
        if mode == "compact":
            print(f"compacted {live.compact()}", flush=True)
    print("done", flush=True)
