"""Crash recovery of the living graph: ``kill -9`` at random points, torn and damaged logs.

A child process applies a deterministic stream of batches (``support.live_graph``) to a
copy of a small graph and prints each sequence the moment ``apply`` returns (it is then
acknowledged). The parent kills it with SIGKILL (before it opened the graph, between two
batches, inside an apply or a compaction), reopens the folder and checks that

* every acknowledged batch is there (and at most the one being applied beyond it);
* the graph equals the stream replayed on a pristine copy up to the recovered sequence
  (node IDs, edge multiset, features): no batch is ever half applied;
* the next process continues the stream from there (it cuts a torn tail first).

Where the kill lands is random (seeded plans, real timing); what is checked is not.
"""

from __future__ import annotations

import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.live_graph import (
    CHILD,
    Expected,
    NaiveGraph,
    assert_same,
    build_store,
    live_state,
    stream_batch,
)
from support.typed_live import (
    DIMS,
    TYPED_CHILD,
    TypedGraph,
    apply_typed_stream,
    typed_edges,
)

from hopserve.worker.graph.live import LiveGraph, forget_live, open_live
from hopserve.worker.graph.live.graph import BASE_FILE, LINEAGE_FILE, LOG_FILE, UPDATES_DIR
from hopserve.worker.graph.live.log import LogCorruptError, UpdateLog
from hopserve.worker.graph.node_types import type_of
from hopserve.worker.graph.topology import GraphTopology

DIM = 4
SEED = 11
TESTS = Path(__file__).resolve().parents[3]
EDGES = [(i, (3 * i + 1) % 14) for i in range(14)] + [(2, 2), (5, 6), (5, 6), (7, 0)]
N = 16  # nodes 14 and 15 start isolated


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("crash") / "pristine"
    build_store(EDGES, N, DIM, id_kind="sparse", seed=5, path=path)
    return path


@pytest.fixture
def graph(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "graph"
    shutil.copytree(pristine, path)
    yield path
    forget_live()


class Child:
    """The writer process; ``events`` collects its stdout lines as they come."""

    def __init__(self, path: Path, mode: str, upto: int, script: str = CHILD) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path), str(SEED), mode, str(upto)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=TESTS.parent,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_for(self, prefix: str, count: int, timeout: float = 60.0) -> bool:
        """Until ``count`` lines starting with ``prefix`` came; False if it exited first."""
        deadline = time.monotonic() + timeout
        while sum(line.startswith(prefix) for line in self.seen) < count:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                return False
            self.seen.append(line)
        return True

    def kill(self) -> None:
        """SIGKILL, then read what it printed before it died."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        while (line := self.lines.get(timeout=30)) is not None:
            self.seen.append(line)
        self.stderr = self.proc.stderr.read()

    @property
    def acked(self) -> list[int]:
        return [int(line.split()[1]) for line in self.seen if line.startswith("ack ")]


def check_recovered(path: Path, expected: Expected, floor: int, acked: list[int]) -> int:
    """Reopen ``path`` in a fresh LiveGraph and check it; returns its sequence."""
    forget_live()
    live = open_live(path, with_features=True)
    seq = live.seq
    last = max(acked, default=floor)
    assert last <= seq <= last + 1, f"acknowledged up to {last}, recovered {seq}"
    assert_same(live_state(live), expected.at(seq), f"recovered at {seq}")
    info = live.info()
    assert info["graph_seq"] == seq and info["base_seq"] <= seq
    first = live.log.first_seq
    assert first is None or first <= info["base_seq"] + 1, "records missing after the base"
    assert live.log.last_seq in (None, seq)
    assert live.base_dir.is_dir()
    forget_live()
    return seq


def run_rounds(
    graph: Path,
    plans: list[tuple[str, str, int, float]],
    recover: Callable[[Path, int, list[int]], int],
    script: str = CHILD,
) -> int:
    """Kill a writer (``script``) once per plan ``(mode, wait_for, count, delay)``: after
    ``count`` lines starting with ``wait_for`` (``count`` 0: right after the spawn) and
    ``delay`` seconds more; ``recover(graph, floor, acked)`` checks the reopened graph and
    returns its sequence. Returns the final sequence."""
    seq = 0
    for mode, prefix, count, delay in plans:
        child = Child(graph, mode, upto=seq + 500, script=script)
        finished = not child.wait_for(prefix, count) if count else False
        time.sleep(delay)
        child.kill()
        assert child.proc.returncode == -signal.SIGKILL or finished, child.stderr
        assert "Traceback" not in child.stderr, child.stderr
        acked = child.acked
        assert acked == list(range(seq + 1, seq + 1 + len(acked))), "acks out of order"
        seq = recover(graph, seq, acked)
    return seq


def _stream_recovery(pristine: Path) -> Callable[[Path, int, list[int]], int]:
    """:func:`check_recovered` against the untyped stream replayed on ``pristine``."""
    expected = Expected(pristine, SEED, DIM)
    return lambda graph, floor, acked: check_recovered(graph, expected, floor, acked)


def test_kill_during_a_stream_of_updates(graph: Path, pristine: Path) -> None:
    rnd = random.Random(1)
    plans = [("stream", "ack", 0, rnd.uniform(0.0, 0.3))]  # very early: before the open
    plans += [("stream", "open", 1, 0.0)]  # right after the open
    plans += [("stream", "ack", rnd.randint(1, 6), rnd.uniform(0, 0.004)) for _ in range(2)]
    seq = run_rounds(graph, plans, _stream_recovery(pristine))
    # a fresh writer (this process) cuts any torn tail and continues the stream
    live = open_live(graph, with_features=True)
    state = live_state(live)
    batch = stream_batch(SEED, seq + 1, state, DIM)
    assert live.apply(batch).seq == seq + 1
    expected = Expected(pristine, SEED, DIM)
    forget_live()
    assert check_recovered(graph, expected, seq + 1, [seq + 1]) == seq + 1
    # and the whole history equals the same stream applied by LiveGraph to a pristine copy
    copy = graph.parent / "replayed"
    shutil.copytree(pristine, copy)
    again = LiveGraph(copy, with_features=True)
    g = live_state(again)
    for s in range(1, seq + 2):
        batch = stream_batch(SEED, s, g, DIM)
        again.apply(batch)
        g.apply(batch)
    recovered = LiveGraph(graph, with_features=True)
    a, b = recovered.snapshot, again.snapshot
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.node_ids, b.node_ids)
    with recovered.reading(), again.reading():
        np.testing.assert_array_equal(recovered.store().features, again.store().features)


def test_kill_during_compaction(graph: Path, pristine: Path) -> None:
    rnd = random.Random(2)
    plans = [("compact", "ack", 1, rnd.uniform(0, 0.03))]  # inside the first compaction
    plans += [("compact", "compacted", rnd.randint(1, 3), rnd.uniform(0, 0.03)) for _ in range(2)]
    plans += [("mixed", "ack", rnd.randint(3, 8), rnd.uniform(0, 0.004))]
    seq = run_rounds(graph, plans, _stream_recovery(pristine))
    # a clean compaction afterwards: only the base in use is left, the log holds no batch
    live = open_live(graph, with_features=True)
    assert live.compact() == seq
    updates = graph / UPDATES_DIR
    bases = sorted(p.name for p in updates.iterdir() if p.is_dir())
    assert bases == [f"base-{seq:012d}"], bases
    assert live.info()["log_batches"] == 0 and live.info()["base_seq"] == seq
    forget_live()
    assert check_recovered(graph, Expected(pristine, SEED, DIM), seq, []) == seq


def check_typed_recovered(path: Path, floor: int, acked: list[int]) -> int:
    """Reopen the typed graph at ``path``: every acknowledged batch of the typed stream is
    there, each node keeps its type, own ID, features and edges; returns its sequence."""
    forget_live()
    live = open_live(path, with_features=True)
    seq = live.seq
    last = max(acked, default=floor)
    assert last <= seq <= last + 1, f"acknowledged up to {last}, recovered {seq}"
    want = TypedGraph()
    for s in range(1, seq + 1):
        apply_typed_stream(want, s)
    topo = live.topology
    assert typed_edges(topo) == want.edges, f"edges at {seq}"
    features = live.store().features.numpy()
    for index, t in enumerate(DIMS):
        storage = topo.typed_storage(want.ids[t], t)
        assert (type_of(topo.meta.node_types, storage) == index).all(), f"types at {seq}"
        np.testing.assert_array_equal(features[storage, : DIMS[t]], want.x[t])
    assert sum(t.total for t in topo.meta.node_types) == topo.num_nodes
    forget_live()
    return seq


def test_kill_during_compaction_of_a_typed_graph_with_added_nodes(tmp_path: Path) -> None:
    """Compactions writing added typed runs (format version 5), killed at random points."""
    graph = tmp_path / "typed"
    TypedGraph().store().save(graph, progress=False)
    rnd = random.Random(3)
    plans = [("compact", "ack", 1, rnd.uniform(0, 0.03))]
    plans += [("compact", "compacted", rnd.randint(1, 3), rnd.uniform(0, 0.03)) for _ in range(3)]
    plans += [("stream", "ack", rnd.randint(2, 5), rnd.uniform(0, 0.004))]
    try:
        seq = run_rounds(graph, plans, check_typed_recovered, script=TYPED_CHILD)
        assert seq >= 3
        live = open_live(graph, with_features=True)
        assert live.compact() == seq
        assert live.topology.meta.format_version == 5
        forget_live()
        assert check_typed_recovered(graph, seq, []) == seq
    finally:
        forget_live()


# ------------------------------------------------------------------ torn and damaged logs
def write_stream(path: Path, count: int) -> list[NaiveGraph]:
    """Apply the stream's first ``count`` batches; returns the state after each."""
    live = LiveGraph(path, with_features=True)
    states = [live_state(live)]
    for s in range(1, count + 1):
        g = states[-1].copy()
        batch = stream_batch(SEED, s, g, DIM)
        live.apply(batch)
        g.apply(batch)
        states.append(g)
    live.log.close()
    return states


def record_bounds(path: Path) -> list[tuple[int, int]]:
    """``(start, end)`` byte range of every record of the log."""
    log = UpdateLog(path)
    return [(offset - 20, offset + length) for _, offset, length in log._records]


@pytest.mark.parametrize("where", ["header", "payload", "last byte", "garbage", "magic only"])
def test_torn_tail_is_cut_by_the_next_writer(graph: Path, where: str) -> None:
    states = write_stream(graph, 4)
    log_path = graph / UPDATES_DIR / LOG_FILE
    start, end = record_bounds(log_path)[-1]
    data = log_path.read_bytes()
    if where == "garbage":  # junk after the last whole record
        torn, want = data + os.urandom(37), 4
    elif where == "magic only":
        torn, want = data + b"HSUL\x05", 4
    else:  # the last record cut short
        cut = {"header": start + 7, "payload": (start + end) // 2, "last byte": end - 1}[where]
        torn, want = data[:cut], 3
    log_path.write_bytes(torn)
    # a reader sees the whole records and leaves the file alone
    reader = LiveGraph(graph, with_features=True)
    assert reader.seq == want
    assert_same(live_state(reader), states[want], "reader")
    assert log_path.read_bytes() == torn
    # the next writer cuts the tail and appends after the last whole record
    writer = LiveGraph(graph, with_features=True)
    g = states[want].copy()
    batch = stream_batch(SEED + 1, want + 1, g, DIM)
    assert writer.apply(batch).seq == want + 1
    g.apply(batch)
    log = UpdateLog(log_path)
    assert (log.first_seq, log.last_seq) == (1, want + 1)
    assert log.size_bytes == log_path.stat().st_size  # nothing torn left
    assert_same(live_state(LiveGraph(graph, with_features=True)), g, "after the cut")
    # the reader opened before the cut catches up to the new record
    with reader.reading(want + 1):
        assert_same(live_state(reader), g, "reader caught up")


@pytest.mark.parametrize("where", ["magic", "seq", "length", "payload", "crc"])
def test_damage_inside_the_log_is_refused(graph: Path, where: str) -> None:
    write_stream(graph, 5)
    log_path = graph / UPDATES_DIR / LOG_FILE
    start, end = record_bounds(log_path)[2]  # the third of five records
    offset = {"magic": 1, "seq": 6, "length": 13, "crc": 17, "payload": 20 + (end - start) // 3}
    data = bytearray(log_path.read_bytes())
    data[start + offset[where]] ^= 0x5A
    log_path.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError, match="followed by more records"):
        LiveGraph(graph, with_features=True)  # a reader: never a silent shorter history
    with pytest.raises(LogCorruptError):
        UpdateLog(log_path).append(6, b"x")  # nor a writer cutting the records after it
    assert log_path.read_bytes() == bytes(data)


def test_damage_appended_while_a_reader_follows_is_refused(graph: Path) -> None:
    write_stream(graph, 3)
    reader = LiveGraph(graph)
    log_path = graph / UPDATES_DIR / LOG_FILE
    tail = len(log_path.read_bytes())
    writer = LiveGraph(graph, with_features=True)
    g = live_state(writer)
    for s in (4, 5):
        batch = stream_batch(SEED, s, g, DIM)
        writer.apply(batch)
        g.apply(batch)
    data = bytearray(log_path.read_bytes())
    data[tail + 25] ^= 0xFF  # inside record 4, record 5 whole after it
    log_path.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        reader.catch_up()
    assert reader.seq == 3


def test_base_pointer_and_log_agree_after_a_crash_between_them(graph: Path) -> None:
    """The compaction's two steps, BASE then the log, interrupted in between (the log
    still holds the batches folded into the new base): replay starts after the base."""
    states = write_stream(graph, 6)
    live = LiveGraph(graph, with_features=True)
    log_before = (graph / UPDATES_DIR / LOG_FILE).read_bytes()
    assert live.compact() == 6
    (graph / UPDATES_DIR / LOG_FILE).write_bytes(log_before)  # as if rewrite never ran
    reopened = LiveGraph(graph, with_features=True)
    assert reopened.base_seq == 6 and reopened.seq == 6
    assert_same(live_state(reopened), states[6], "base + whole log")
    g = states[6].copy()
    batch = stream_batch(SEED, 7, g, DIM)
    assert reopened.apply(batch).seq == 7
    g.apply(batch)
    assert_same(live_state(LiveGraph(graph, with_features=True)), g, "continued")
    assert (graph / UPDATES_DIR / BASE_FILE).is_file()


class Crash(BaseException):
    """A process dying at this point (nothing after it runs)."""


@pytest.mark.parametrize("point", ["uuid4", "fsync"])
def test_crash_while_creating_the_lineage(graph: Path, monkeypatch, point: str) -> None:
    """The first open writes ``updates/LINEAGE``; dying half-way must not leave a file
    that no process can open (an empty LINEAGE was refused forever)."""
    import hopserve.worker.graph.live.graph as graph_module

    def die(*args, **kwargs):
        raise Crash

    target = graph_module.uuid if point == "uuid4" else graph_module.os
    monkeypatch.setattr(target, point, die)
    with pytest.raises(Crash):
        LiveGraph(graph)
    monkeypatch.undo()
    LiveGraph(graph)
    lineage = (graph / UPDATES_DIR / LINEAGE_FILE).read_text()
    LiveGraph(graph)
    assert (graph / UPDATES_DIR / LINEAGE_FILE).read_text() == lineage  # created once
    content, token = lineage.strip().rsplit(".", 1)
    assert content == GraphTopology.open(graph).version and len(token) == 12


@pytest.mark.parametrize("failure", ["fsync", "short write"])
def test_a_log_write_that_fails_applies_nothing(graph: Path, monkeypatch, failure: str) -> None:
    """A full disk: the append raises, the graph stays at its sequence, the file holds no
    part of the record, and the next batch is appended as if nothing happened."""
    import hopserve.worker.graph.live.log as log_module

    states = write_stream(graph, 2)
    live = LiveGraph(graph, with_features=True)
    log_path = graph / UPDATES_DIR / LOG_FILE
    size, snap = log_path.stat().st_size, live.snapshot
    real_write = os.write
    if failure == "fsync":

        def broken(fd):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(log_module.os, "fsync", broken)
    else:

        def broken(fd, data):
            return real_write(fd, data[: len(data) // 2])

        monkeypatch.setattr(log_module.os, "write", broken)
    g = states[2].copy()
    batch = stream_batch(SEED, 3, g, DIM)
    with pytest.raises(OSError):
        live.apply(batch)
    monkeypatch.undo()
    assert live.seq == 2 and live.snapshot is snap
    assert log_path.stat().st_size == size
    assert_same(live_state(live), states[2], "after the failed append")
    assert live.apply(batch).seq == 3
    g.apply(batch)
    assert_same(live_state(LiveGraph(graph, with_features=True)), g, "reopened")
