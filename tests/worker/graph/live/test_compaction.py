"""Compaction under load, and a second process that follows the graph across compactions.

* Reader threads check every snapshot they are handed (under ``reading()``: the store's
  IDs, edges and features against the stream replayed to that snapshot's sequence) while
  a thread applies the stream and the main thread compacts: no reader ever sees a mix of
  two sequences, a reopened graph equals the live one, old bases are removed and
  ``info()`` counts right.
* A worker-like process opened before the compactions catches up to any later sequence
  it is asked for (``reading(seq)``), through one compaction or several (the log file
  replaced each time), and refuses a sequence it has moved past.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.live_graph import (
    READER,
    Expected,
    NaiveGraph,
    assert_same,
    build_store,
    digest,
    live_state,
    stream_batch,
)

from hopserve.worker.graph.live import LiveGraph, forget_live, open_live
from hopserve.worker.graph.live.graph import UPDATES_DIR
from hopserve.worker.graph.live.log import UpdateLog

DIM = 4
SEED = 23
TESTS = Path(__file__).resolve().parents[3]
EDGES = [(i, (5 * i + 2) % 20) for i in range(20)] + [(3, 3), (8, 9), (8, 9), (19, 0)]
N = 22  # nodes 20 and 21 start isolated


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compaction") / "pristine"
    build_store(EDGES, N, DIM, id_kind="dense", seed=9, path=path)
    return path


@pytest.fixture
def graph(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "graph"
    shutil.copytree(pristine, path)
    yield path
    forget_live()


def base_dirs(graph: Path) -> list[str]:
    return sorted(p.name for p in (graph / UPDATES_DIR).iterdir() if p.is_dir())


def apply_stream(live: LiveGraph, upto: int) -> None:
    g = live_state(live)
    for seq in range(live.seq + 1, upto + 1):
        batch = stream_batch(SEED, seq, g, DIM)
        assert live.apply(batch).seq == seq
        g.apply(batch)


def test_compaction_under_load(graph: Path, pristine: Path) -> None:
    total, pauses = 40, (14, 28)
    expected = Expected(pristine, SEED, DIM)
    want = [digest(expected.at(seq)) for seq in range(total + 1)]
    live = open_live(graph, with_features=True)
    stop, compacted = threading.Event(), threading.Condition()
    count = [0]  # compactions finished
    errors: list[str] = []
    seen: list[set[int]] = [set(), set(), set()]

    def reader(i: int) -> None:
        try:
            while True:
                last = stop.is_set()  # one more read after the writer is done
                with live.reading() as snap:
                    store = live.store()
                    assert store.num_nodes == snap.num_nodes == store.features.shape[0]
                    assert store.num_edges == snap.num_edges
                    g = NaiveGraph.of_snapshot(snap, store.features.numpy())
                if digest(g) != want[snap.seq]:
                    errors.append(f"reader {i} at {snap.seq}: {digest(g)} != {want[snap.seq]}")
                seen[i].add(snap.seq)
                if last:
                    break
                time.sleep(0.001)  # leave the GIL to the writer now and then (speed only)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(f"reader {i}: {err!r}")

    def updater() -> None:
        try:
            g = live_state(live)
            for seq in range(1, total + 1):
                if seq in pauses:  # a whole compaction runs from here, whatever the timing
                    with compacted:
                        goal = count[0] + 2
                        assert compacted.wait_for(lambda g=goal: count[0] >= g, timeout=60)
                batch = stream_batch(SEED, seq, g, DIM)
                assert live.apply(batch).seq == seq
                g.apply(batch)
        except BaseException as err:  # noqa: BLE001
            errors.append(f"updater: {err!r}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    writer = threading.Thread(target=updater)
    for t in threads + [writer]:
        t.start()
    folded = []
    while writer.is_alive() or not folded:
        folded.append(live.compact())
        with compacted:
            count[0] += 1
            compacted.notify_all()
        time.sleep(0.005)  # speed only: a compaction per few batches is plenty
    writer.join()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:5]
    assert all(total in s for s in seen), seen  # each read the last sequence too
    assert sum(f >= pauses[-1] - 1 for f in folded) >= 1, folded  # compacted mid-stream
    assert folded == sorted(folded)
    # after the load: the base in use only, info() right, a reopened graph equals this one
    assert live.compact() == total
    assert base_dirs(graph) == [f"base-{total:012d}"]
    info = live.info()
    assert (info["graph_seq"], info["base_seq"], info["log_batches"]) == (total, total, 0)
    assert info["log_bytes"] == 0 and not info["compacting"]
    apply_stream(live, total + 3)
    info = live.info()
    assert (info["graph_seq"], info["base_seq"], info["log_batches"]) == (total + 3, total, 3)
    assert info["log_bytes"] == (graph / UPDATES_DIR / "log").stat().st_size > 0
    forget_live()
    reopened = open_live(graph, with_features=True)
    assert reopened is not live and reopened.seq == total + 3 and reopened.base_seq == total
    assert_same(live_state(reopened), live_state(live), "reopened")
    assert_same(live_state(reopened), expected.at(total + 3), "replayed")
    a, b = reopened.snapshot, live.snapshot
    for name in ("indptr", "indices", "node_ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert reopened.info()["log_batches"] == 3


class Reader:
    """The worker-like process (``support.live_graph.reader_main``)."""

    def __init__(self, path: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=TESTS.parent,
        )
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["open"], line + [self.proc.stderr.read()]
        self.opened_at = int(line[1])

    def read(self, seq: int | str) -> list[str]:
        self.proc.stdin.write(f"read {seq}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        return line.split(maxsplit=2) if line.startswith("error") else line.split()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def parse_state(words: list[str]) -> tuple[int, tuple]:
    assert words[0] == "state", words
    *ints, feats = words[1:]
    ints = [int(w) for w in ints]
    return ints[0], (*ints[1:], float(feats))


def test_a_second_process_follows_compactions(graph: Path, pristine: Path) -> None:
    expected = Expected(pristine, SEED, DIM)
    live = LiveGraph(graph, with_features=True)  # the front-end (the writer)
    apply_stream(live, 3)
    worker = Reader(graph)  # opened at 3, its log file indexed
    try:
        assert worker.opened_at == 3

        def check(seq: int | str, at: int) -> None:
            got_seq, got = parse_state(worker.read(seq))
            assert got_seq == at and got == digest(expected.at(at)), f"read {seq}"

        check("now", 3)
        apply_stream(live, 5)
        check(5, 5)  # caught up from the same log file
        # one compaction (at the worker's sequence + 2): the log it indexed is replaced
        apply_stream(live, 7)
        assert live.compact() == 7
        apply_stream(live, 9)
        check(9, 9)
        # two compactions before it looks again: the second log file is a third file
        # (a reused inode number must not pass for the file it indexed)
        apply_stream(live, 12)
        assert live.compact() == 12
        apply_stream(live, 14)
        assert live.compact() == 14
        apply_stream(live, 16)
        check(16, 16)
        # a compaction exactly at its sequence, then its own sequence and later ones
        assert live.compact() == 16
        check("now", 16)
        check(16, 16)
        apply_stream(live, 17)
        check(17, 17)
        # it refuses a sequence it has moved past (the job is planned again)
        words = worker.read(16)
        assert words[:2] == ["error", "GraphSeqError"], words
        # the base it opened on is deleted by a later compaction: still exact
        assert base_dirs(graph) == ["base-000000000016"]
        apply_stream(live, 19)
        assert live.compact() == 19
        assert base_dirs(graph) == ["base-000000000019"]
        check("now", 17)
        apply_stream(live, 20)
        check(20, 20)
    finally:
        worker.close()


def test_a_process_opened_on_a_compacted_base_outlives_it(graph: Path, pristine: Path) -> None:
    """A worker opens on base-N and serves sequence N from it; the front-end moves on and
    a compaction deletes base-N: a job planned at N is still answered exactly."""
    expected = Expected(pristine, SEED, DIM)
    live = LiveGraph(graph, with_features=True)
    apply_stream(live, 4)
    assert live.compact() == 4
    worker = Reader(graph)
    try:
        assert worker.opened_at == 4
        apply_stream(live, 6)
        assert live.compact() == 6
        assert base_dirs(graph) == ["base-000000000006"]  # base-4 is gone
        got_seq, got = parse_state(worker.read(4))
        assert got_seq == 4 and got == digest(expected.at(4))
        got_seq, got = parse_state(worker.read(6))
        assert got_seq == 6 and got == digest(expected.at(6))
    finally:
        worker.close()


def test_a_log_reader_two_rewrites_behind(tmp_path: Path) -> None:
    """Two compactions in a row on ext4 hand the second new log file the first one's
    freed inode number: a reader that remembers only the number took the new file for
    the one it indexed and read nothing (it held the graph at its old sequence)."""
    path = tmp_path / "log"
    writer = UpdateLog(path)
    for seq in (1, 2, 3):
        writer.append(seq, b"x" * 40)
    reader = UpdateLog(path)
    seq = 3
    for cycle in range(6):
        for _ in range(2):  # two compactions while the reader is not looking
            seq += 1
            writer.append(seq, bytes([cycle]) * (40 + cycle))
            writer.rewrite(after=seq - 1)
        seq += 1
        writer.append(seq, b"y" * 40)
        got = [s for s, _ in reader.read(seq - 2, seq)]
        assert got == [seq - 1, seq], f"cycle {cycle}"
        assert (reader.first_seq, reader.last_seq) == (seq - 1, seq)
        assert dict(reader.read(seq - 2, seq))[seq - 1] == bytes([cycle]) * (40 + cycle)


def test_a_process_without_features_compacts_exactly(graph: Path, pristine: Path) -> None:
    """The front-end keeps no features (its ``open_live`` has none) and it is the one that
    compacts: the new base must hold the features the batches set and added, not the old
    base's rows (every acknowledged feature update was lost at the first compaction)."""
    expected = Expected(pristine, SEED, DIM)
    front = LiveGraph(graph)  # no features
    apply_stream(front, 8)
    assert front.compact() == 8
    apply_stream(front, 13)
    assert front.compact() == 13  # from a compacted base + the log's rest
    worker = LiveGraph(graph, with_features=True)
    assert (worker.base_seq, worker.seq) == (13, 13)
    assert_same(live_state(worker), expected.at(13), "compacted without features")
    apply_stream(front, 15)
    worker.catch_up()
    assert_same(live_state(worker), expected.at(15), "and after it")


def test_a_crash_between_base_and_log_rewrite_is_trimmed_by_the_next_compaction(
    graph: Path,
) -> None:
    """Killed after ``BASE`` moved but before the log was rewritten: the log still holds
    the folded batches. The next compaction finds the base current and must trim them
    (else every update would start an auto-compaction that finds nothing to do)."""
    live = LiveGraph(graph, with_features=True)
    apply_stream(live, 5)
    log_path = graph / UPDATES_DIR / "log"
    before = log_path.read_bytes()
    assert live.compact() == 5
    live.log.close()
    log_path.write_bytes(before)  # the rewrite never happened
    reopened = LiveGraph(graph, with_features=True)
    assert reopened.info()["base_seq"] == 5 and reopened.info()["log_batches"] == 5
    assert reopened.compact() == 5
    assert reopened.info()["log_batches"] == 0
    assert base_dirs(graph) == [f"base-{5:012d}"]
    again = LiveGraph(graph, with_features=True)
    assert again.seq == 5 and again.info()["log_batches"] == 0
    assert_same(live_state(again), live_state(reopened), "after the trim")
