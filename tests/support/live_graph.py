"""Helpers for the living-graph tests: tiny stores, a naive Python model of a graph under
mutation batches, and a deterministic stream of valid batches.

Everything here speaks *external* node IDs. The naive model is deliberately simple (a
list, a dict and a Counter) so it can serve as the oracle for the spliced CSC, the ID
index and the update log.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np

from hopserve.worker.graph.live import MutationBatch

__all__ = [
    "NaiveGraph",
    "build_store",
    "edge_data_batch",
    "live_state",
    "random_batch",
    "stream_batch",
]

ID_KINDS = ("identity", "dense", "sparse")


def build_store(
    edges: list[tuple[int, int]],
    n: int,
    dim: int = 3,
    *,
    id_kind: str = "sparse",
    seed: int = 0,
    path: str | Path | None = None,
):
    """A GraphStore of ``n`` nodes (edges between row indices ``0..n-1``).

    ``id_kind``: ``"identity"`` (no node_ids, no reordering), ``"dense"`` (row index as
    ID, RCMK-reordered storage), ``"sparse"`` (arbitrary distinct IDs, some negative).
    Saved to ``path`` when given.
    """
    import torch

    from hopserve import GraphStore

    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((n, dim)).astype(np.float32))
    ei = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).T.contiguous()
    if id_kind == "identity":
        store = GraphStore.from_edge_index(ei, x, reorder=None)
    elif id_kind == "dense":
        store = GraphStore.from_edge_index(ei, x)
    else:
        ids = rng.choice(np.arange(-50, 1000), size=n, replace=False).astype(np.int64)
        store = GraphStore.from_edge_index(ei, x, node_ids=torch.from_numpy(ids))
    if path is not None:
        store.save(path, progress=False)
    return store


class NaiveGraph:
    """External IDs in storage order, features by ID, edges as a multiset of ID pairs."""

    def __init__(self, ids: list[int], features: dict[int, np.ndarray], edges: Counter) -> None:
        self.ids = list(ids)
        self.features = dict(features)
        self.edges = Counter(edges)

    @classmethod
    def of_store(cls, store) -> NaiveGraph:
        ext = store.to_external(np.arange(store.num_nodes))
        ext = [int(v) for v in np.asarray(ext)]
        ei = np.asarray(store.edge_index())
        feats = np.asarray(store.features, dtype=np.float32)
        edges = Counter(
            (ext[s], ext[d]) for s, d in zip(ei[0].tolist(), ei[1].tolist(), strict=True)
        )
        return cls(ext, {v: feats[i].copy() for i, v in enumerate(ext)}, edges)

    @classmethod
    def of_snapshot(cls, snap, features=None) -> NaiveGraph:
        ext = [int(v) for v in snap.to_external(np.arange(snap.num_nodes))]
        ei = snap.edge_index()
        edges = Counter(
            (ext[s], ext[d]) for s, d in zip(ei[0].tolist(), ei[1].tolist(), strict=True)
        )
        feats = {}
        if features is not None:
            feats = {v: np.asarray(features[i], dtype=np.float32).copy() for i, v in enumerate(ext)}
        return cls(ext, feats, edges)

    def copy(self) -> NaiveGraph:
        return NaiveGraph(self.ids, self.features, self.edges)

    @property
    def num_nodes(self) -> int:
        return len(self.ids)

    def apply(self, batch: MutationBatch) -> None:
        """The batch's meaning, spelled out (the batch must be valid)."""
        add_feats = batch.add_node_features
        for i, v in enumerate(batch.add_node_ids.tolist()):
            self.ids.append(v)
            self.features[v] = np.asarray(add_feats[i], dtype=np.float32).copy()
        for s, d in zip(batch.remove_src.tolist(), batch.remove_dst.tolist(), strict=True):
            self.edges.pop((s, d), None)
        for s, d in zip(batch.add_src.tolist(), batch.add_dst.tolist(), strict=True):
            self.edges[(s, d)] += 1
        for i, v in enumerate(batch.set_node_ids.tolist()):
            self.features[v] = np.asarray(batch.set_features[i], dtype=np.float32).copy()

    def in_degree(self, v: int) -> int:
        return sum(c for (_, d), c in self.edges.items() if d == v)

    def out_degree(self, v: int) -> int:
        return sum(c for (s, _), c in self.edges.items() if s == v)


def random_batch(rng: random.Random, g: NaiveGraph, dim: int, *, key: str = "") -> MutationBatch:
    """A random *valid* batch for ``g`` (choices made on sorted lists: deterministic)."""
    present = sorted(g.ids)
    taken = set(present)
    k = rng.choice([0, 0, 1, 2, 3])
    new: list[int] = []
    while len(new) < k:
        v = rng.randrange(-100, 2000)
        if v not in taken:
            taken.add(v)
            new.append(v)
    pairs = sorted(g.edges)
    n_remove = rng.randint(0, min(3, len(pairs)))
    remove = [rng.choice(pairs) for _ in range(n_remove)]  # a pair may be named twice
    everyone = present + new
    n_add = rng.randint(0, 4)
    add = [(rng.choice(everyone), rng.choice(everyone)) for _ in range(n_add)]
    if rng.random() < 0.3 and remove:  # remove and add back the same pair
        add.append(remove[0])
    n_set = rng.randint(0, 3)
    set_ids = [rng.choice(everyone) for _ in range(n_set)]  # repeats: the last row wins
    if not (new or remove or add or set_ids):
        set_ids = [rng.choice(everyone)]

    def rows(m: int) -> np.ndarray:
        return np.array(
            [[rng.uniform(-2, 2) for _ in range(dim)] for _ in range(m)], dtype=np.float32
        ).reshape(m, dim)

    return MutationBatch(
        add_node_ids=np.array(new, dtype=np.int64),
        add_node_features=rows(len(new)) if new else None,
        remove_src=np.array([s for s, _ in remove], dtype=np.int64),
        remove_dst=np.array([d for _, d in remove], dtype=np.int64),
        add_src=np.array([s for s, _ in add], dtype=np.int64),
        add_dst=np.array([d for _, d in add], dtype=np.int64),
        set_node_ids=np.array(set_ids, dtype=np.int64),
        set_features=rows(len(set_ids)) if set_ids else None,
        idempotency_key=key,
    )


def edge_data_batch(rng: random.Random, g: NaiveGraph, dim: int, d_e: int) -> MutationBatch:
    """:func:`random_batch` whose added edges carry a weight and a feature row (width
    ``d_e``) each, with a duplicate of an existing edge and a self-loop among them."""
    batch = random_batch(rng, g, dim)
    extra = [rng.choice(sorted(g.edges)), (rng.choice(g.ids),) * 2]
    batch.add_src = np.concatenate([batch.add_src, [s for s, _ in extra]]).astype(np.int64)
    batch.add_dst = np.concatenate([batch.add_dst, [d for _, d in extra]]).astype(np.int64)
    k = batch.add_src.size
    batch.add_edge_weight = np.array([rng.uniform(0.1, 3) for _ in range(k)], np.float32)
    batch.add_edge_features = np.array(
        [[rng.uniform(-2, 2) for _ in range(d_e)] for _ in range(k)], np.float32
    ).reshape(k, d_e)
    return batch


def stream_batch(seed: int, seq: int, g: NaiveGraph, dim: int) -> MutationBatch:
    """Batch number ``seq`` of the deterministic stream ``seed`` (a function of the
    seed, the sequence and the graph it applies to)."""
    return random_batch(random.Random(seed * 1_000_003 + seq), g, dim, key=f"s{seed}-{seq}")


class Expected:
    """The stream ``seed`` replayed on a pristine store, one state per sequence (cached)."""

    def __init__(self, pristine: str | Path, seed: int, dim: int) -> None:
        from hopserve import GraphStore

        self.seed, self.dim = seed, dim
        self.states = [NaiveGraph.of_store(GraphStore.open(pristine))]

    def at(self, seq: int) -> NaiveGraph:
        while len(self.states) <= seq:
            g = self.states[-1].copy()
            g.apply(stream_batch(self.seed, len(self.states), g, self.dim))
            self.states.append(g)
        return self.states[seq]


def assert_same(got: NaiveGraph, want: NaiveGraph, what: str) -> None:
    """Same node IDs in the same storage order, same edge multiset, same features."""
    assert got.ids == want.ids, f"{what}: node IDs"
    assert got.edges == want.edges, f"{what}: edges"
    for v in want.ids:
        np.testing.assert_array_equal(got.features[v], want.features[v], err_msg=f"{what}: {v}")


def digest(g: NaiveGraph) -> tuple:
    """A few numbers that differ between any two states of a stream (for a reader that
    checks many snapshots quickly, or reports to its parent): node count, edge count, an
    edge-multiset checksum and a feature checksum weighted by node (exact: the same
    float32 values summed in the same order give the same float64)."""
    edges = sum(c * ((s * 1_000_003 + d) % 998_244_353) for (s, d), c in g.edges.items())
    ids = sorted(g.ids)
    feats = np.stack([g.features[v] for v in ids]).astype(np.float64)
    weights = np.array([(v % 97) + 1 for v in ids], dtype=np.float64)
    order = sum(i * v for i, v in enumerate(g.ids)) % 998_244_353  # storage order of the IDs
    return (len(ids), sum(g.edges.values()), edges, order, float((feats.T * weights).sum()))


def live_state(live) -> NaiveGraph:
    """The living graph's current state (features included) as a naive model."""
    with live.reading():
        store = live.store()
        return NaiveGraph.of_snapshot(live.snapshot, store.features.numpy())


# ---------------------------------------------------------------------------- child process
CHILD = "from support.live_graph import child_main; child_main()"
"""``python -c CHILD PATH SEED MODE UPTO`` (with ``tests/`` on ``sys.path``)."""


def child_main() -> None:
    """A writer process for the crash tests: opens the living graph at ``PATH`` with
    features and applies the stream ``SEED`` from its current sequence up to ``UPTO``,
    printing ``ack <seq>`` the moment each ``apply`` returns. ``MODE`` ``compact``
    compacts after every batch (printing ``compacted <seq>``); ``mixed`` every fifth."""
    import sys

    from hopserve.worker.graph.live import LiveGraph

    path, seed, mode, upto = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    live = LiveGraph(path, with_features=True)
    print(f"open {live.seq}", flush=True)
    g = live_state(live)
    dim = live.snapshot.feature_dim
    while live.seq < upto:
        batch = stream_batch(seed, live.seq + 1, g, dim)
        result = live.apply(batch)
        print(f"ack {result.seq}", flush=True)
        g.apply(batch)
        if mode == "compact" or (mode == "mixed" and result.seq % 5 == 0):
            print(f"compacted {live.compact()}", flush=True)
    print("done", flush=True)


READER = "from support.live_graph import reader_main; reader_main()"
"""``python -c READER PATH`` (with ``tests/`` on ``sys.path``): a worker-like reader."""


def reader_main() -> None:
    """A worker-like process: opens the living graph at ``PATH`` with features (through
    ``open_live``) and answers ``read <seq>`` lines on stdin with ``state <seq> <digest>``
    of ``reading(seq)`` (``now`` = its current sequence), or ``error <type> <message>``."""
    import sys

    from hopserve.worker.graph.live import open_live

    live = open_live(sys.argv[1], with_features=True)
    print(f"open {live.seq}", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd != "read":
            break
        seq = None if args[0] == "now" else int(args[0])
        try:
            with live.reading(seq) as snap:
                g = NaiveGraph.of_snapshot(snap, live.store().features.numpy())
            print("state", snap.seq, *digest(g), flush=True)
        except Exception as err:  # reported to the parent, which decides
            message = str(err).replace("\n", " ")
            print("error", type(err).__name__, message, flush=True)
