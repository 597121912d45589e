"""What the benchmark client sends: the query stream, the checker's probes, the update batches.

* :class:`GraphView` — the base graph as a client knows it: external IDs, in-neighbours
  (the stored CSC), the hubs;
* :func:`query_stream` — one seeded list of requests (arrival time, model, targets) that
  every phase of every configuration replays, so that phases differ only by their updates:
  Poisson arrivals, Zipf popularity over a shuffled ID space (``client/loadtest.py``'s
  sampler), and a share of requests drawn from the hot keys only (the top Zipf ranks);
* :func:`probe_nodes` — nodes the query stream never asks for, which the checker owns: each
  update batch carries one edge that changes one probe's row (into the probe: 1 hop, or
  into one of its in-neighbours: 2 hops), and the checker asks for that probe after the
  acknowledgement;
* :class:`UpdateSource` — edge mutations: 90 % random additions, 10 % removals of edges it
  added before (so every removal is valid), plus the probe edge; new nodes for cold start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODELS = ("sage", "gcn")


class GraphView:
    """The stored base graph, read the way a client could (``node_ids``, CSC arrays)."""

    def __init__(self, graph: Path) -> None:
        graph = Path(graph)
        meta = json.loads((graph / "meta.json").read_text())
        self.num_nodes = int(meta["num_nodes"])
        self.num_edges = int(meta["num_edges"])
        self.feature_dim = int(meta["feature_dim"])
        path = graph / "node_ids.npy"
        self.ids = np.load(path) if path.is_file() else np.arange(self.num_nodes, dtype=np.int64)
        self.indptr = np.load(graph / "indptr.npy", mmap_mode="r")
        self.indices = np.load(graph / "indices.npy", mmap_mode="r")

    def in_neighbours(self, storage: int) -> np.ndarray:
        """Storage ids of the in-neighbours of one storage node."""
        return np.asarray(self.indices[self.indptr[storage] : self.indptr[storage + 1]])

    def hubs(self) -> dict[str, int]:
        """External IDs and degrees of the largest out-degree and in-degree nodes."""
        out_deg = np.bincount(np.asarray(self.indices), minlength=self.num_nodes)
        in_deg = np.diff(np.asarray(self.indptr))
        o, i = int(out_deg.argmax()), int(in_deg.argmax())
        return {
            "out_hub": int(self.ids[o]),
            "out_hub_degree": int(out_deg[o]),
            "in_hub": int(self.ids[i]),
            "in_hub_degree": int(in_deg[i]),
            "median_out_degree": float(np.median(out_deg)),
        }


@dataclass(frozen=True)
class Request:
    """One request of the query stream."""

    at: float
    """Seconds after the phase start it is sent (open loop)."""
    model: str
    hot: bool
    """Drawn from the hot keys only."""
    ids: np.ndarray
    """External target IDs."""


def query_stream(
    view: GraphView,
    *,
    rate: float,
    duration: float,
    set_size: int,
    zipf: float,
    hot_keys: int,
    hot_fraction: float,
    seed: int,
) -> tuple[list[Request], np.ndarray]:
    """The requests of one phase (Poisson arrivals at ``rate`` for ``duration`` seconds)
    and the hot keys (the ``hot_keys`` most popular IDs).

    Each request asks one model (alternating at random) for ``set_size`` targets: with
    probability ``hot_fraction`` uniformly among the hot keys, else from the Zipf law.
    """
    from hopserve.client.loadtest import LoadSpec, TargetSampler

    spec = LoadSpec(model=MODELS[0], set_size=set_size, zipf_a=zipf, seed=seed)
    sampler = TargetSampler(view.ids, spec)
    hot = sampler.ids[:hot_keys].copy()
    rng = np.random.default_rng(seed + 1)
    out: list[Request] = []
    at = float(rng.exponential(1.0 / rate))
    while at < duration:
        model = MODELS[int(rng.integers(len(MODELS)))]
        is_hot = bool(rng.random() < hot_fraction)
        ids = rng.choice(hot, set_size) if is_hot else sampler.draw()
        out.append(Request(at, model, is_hot, np.asarray(ids, dtype=np.int64)))
        at += float(rng.exponential(1.0 / rate))
    return out, hot


@dataclass(frozen=True)
class Probe:
    """A node whose row one update edge changes, and how far away that edge is."""

    node: int
    """External ID the checker asks for."""
    via: int
    """Destination of the update edge: ``node`` itself (1 hop) or an in-neighbour (2 hops)."""
    hops: int


def probe_nodes(view: GraphView, avoid: np.ndarray, count: int, seed: int) -> list[Probe]:
    """``count`` probes among nodes outside ``avoid`` (the stream's targets), alternately
    1-hop and 2-hop (a 2-hop probe's edge goes into one of its in-neighbours, also outside
    ``avoid``)."""
    rng = np.random.default_rng(seed + 2)
    avoid_set = set(np.asarray(avoid).tolist())
    probes: list[Probe] = []
    while len(probes) < count:
        s = int(rng.integers(view.num_nodes))
        node = int(view.ids[s])
        if node in avoid_set:
            continue
        if len(probes) % 2 == 0:
            probes.append(Probe(node, node, 1))
            avoid_set.add(node)
            continue
        ins = [x for x in view.in_neighbours(s).tolist() if x != s]
        ins = [int(view.ids[x]) for x in ins if int(view.ids[x]) not in avoid_set]
        if not ins:
            continue
        probes.append(Probe(node, ins[0], 2))
        avoid_set.update((node, ins[0]))
    return probes


@dataclass
class Batch:
    """One update batch as sent (external IDs)."""

    add_src: np.ndarray
    add_dst: np.ndarray
    remove_src: np.ndarray
    remove_dst: np.ndarray
    probe: Probe

    @property
    def mutations(self) -> int:
        return int(self.add_src.size + self.remove_src.size)


class UpdateSource:
    """Edge mutations for the updater (see the module docstring).

    Args:
        view: The graph (endpoints are drawn uniformly from its nodes).
        probes: The checker's probes, one per batch in turn.
        seed: Random seed.
        remove_fraction: Share of a batch's mutations that remove an edge added earlier
            (fewer while not enough have been added).
    """

    def __init__(
        self, view: GraphView, probes: list[Probe], seed: int, remove_fraction: float = 0.1
    ) -> None:
        self.view = view
        self.probes = probes
        self.rng = np.random.default_rng(seed + 3)
        self.remove_fraction = remove_fraction
        self._added: list[tuple[int, int]] = []  # removable pairs (added, acknowledged)
        self._present: set[tuple[int, int]] = set()
        self._next_probe = 0
        self._next_id = int(view.ids.max()) + 1_000_000  # new nodes' external IDs

    def batch(self, k: int) -> Batch:
        """``k`` mutations (at least the probe edge)."""
        probe = self.probes[self._next_probe % len(self.probes)]
        self._next_probe += 1
        removes = min(int(k * self.remove_fraction), len(self._added))
        adds = max(k - removes - 1, 0)
        pairs = []
        for _ in range(removes):  # swap-remove a random acknowledged addition
            i = int(self.rng.integers(len(self._added)))
            self._added[i], self._added[-1] = self._added[-1], self._added[i]
            pair = self._added.pop()
            self._present.discard(pair)
            pairs.append(pair)
        ids = self.view.ids
        src = ids[self.rng.integers(self.view.num_nodes, size=adds + 1)]
        dst = ids[self.rng.integers(self.view.num_nodes, size=adds)]
        rem = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return Batch(
            add_src=src.astype(np.int64),
            add_dst=np.concatenate([dst, [probe.via]]).astype(np.int64),
            remove_src=rem[:, 0].copy(),
            remove_dst=rem[:, 1].copy(),
            probe=probe,
        )

    def commit(self, batch: Batch) -> None:
        """The batch was acknowledged: its random additions become removable."""
        for pair in zip(batch.add_src[:-1].tolist(), batch.add_dst[:-1].tolist(), strict=True):
            if pair not in self._present:
                self._present.add(pair)
                self._added.append(pair)

    def new_nodes(
        self, k: int, degree: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``k`` new nodes with ``degree`` in-edges and ``degree`` out-edges each to random
        existing nodes: ``(ids, features [k, F], edge src, edge dst)``."""
        new = np.arange(self._next_id, self._next_id + k, dtype=np.int64)
        self._next_id += k
        feats = self.rng.standard_normal((k, self.view.feature_dim)).astype(np.float32)
        ids = self.view.ids
        others_in = ids[self.rng.integers(self.view.num_nodes, size=k * degree)]
        others_out = ids[self.rng.integers(self.view.num_nodes, size=k * degree)]
        mine = np.repeat(new, degree)
        src = np.concatenate([others_in, mine])
        dst = np.concatenate([mine, others_out])
        return new, feats, src, dst
