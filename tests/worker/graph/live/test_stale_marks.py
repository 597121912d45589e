"""Stale-since marks: set before a reader can see the new sequence, and kept by every
process that follows the log (a worker process catching up marks what the writer marked)."""

from __future__ import annotations

import random
import threading

import numpy as np
from support.live_graph import build_store, live_state, random_batch

from hopserve.worker.graph.live.graph import LiveGraph

DIM = 3
KINDS = [(1, False, False), (2, True, True)]


def _graph(tmp_path):
    rng = np.random.default_rng(0)
    edges = [(int(s), int(d)) for s, d in rng.integers(0, 40, (120, 2))]
    path = tmp_path / "g"
    build_store(edges, 40, DIM, id_kind="sparse", seed=1, path=path)
    return path


def test_a_process_catching_up_marks_what_the_writer_marked(tmp_path):
    path = _graph(tmp_path)
    writer, follower = LiveGraph(path, with_features=True), LiveGraph(path)
    for kind in KINDS:
        writer.track(kind)
        follower.track(kind)
    rnd = random.Random(2)
    for _ in range(6):
        writer.apply(random_batch(rnd, live_state(writer), DIM))
    follower.catch_up()
    assert follower.seq == writer.seq == 6
    nodes = np.arange(writer.topology.num_nodes)
    for kind in KINDS:
        want = writer.stale_since(kind, nodes)
        assert (want > 0).any()
        np.testing.assert_array_equal(follower.stale_since(kind, nodes), want)


def test_a_reader_never_sees_a_sequence_without_its_marks(tmp_path):
    """Rows of the affected nodes read at the new sequence are stale at that sequence."""
    path = _graph(tmp_path)
    live = LiveGraph(path, with_features=True)
    kind = KINDS[1]
    live.track(kind)
    nodes = np.arange(40)
    seen: list[tuple[int, np.ndarray]] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            with live.reading() as snap:
                seen.append((snap.seq, live.stale_since(kind, nodes)))

    reader = threading.Thread(target=read)
    reader.start()
    rnd = random.Random(5)
    results = []
    try:
        for _ in range(20):
            results.append(live.apply(random_batch(rnd, live_state(live), DIM)))
    finally:
        stop.set()
        reader.join()
    marked = {r.seq: r.affected[kind] for r in results}
    for seq, stale in seen:
        affected = marked.get(seq)
        if affected is not None:
            affected = affected[affected < 40]
            assert (stale[affected] >= seq).all(), seq
