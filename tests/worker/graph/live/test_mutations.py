"""MutationBatch checks (``resolve``) and log bytes (``encode`` / ``decode``).

Every kind of bad batch is refused whole, with a message naming the offending mutation
(kind and index), and leaves the living graph exactly as it was: sequence, log bytes,
topology and features. Valid batches round-trip through the log bytes unchanged.
"""

from __future__ import annotations

import random
import re
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.live_graph import ID_KINDS, NaiveGraph, build_store, live_state, random_batch

from hopserve.worker.graph.live import InvalidUpdateError, LiveGraph, MutationBatch
from hopserve.worker.graph.live.mutations import MAX_KEY_CHARS, decode, encode, resolve
from hopserve.worker.graph.live.snapshot import GraphSnapshot

DIM = 3
EDGES = [(0, 1), (1, 2), (2, 2), (2, 2), (3, 0), (4, 1), (1, 4)]  # node 5 is isolated
N = 6


def rows(m: int, dim: int = DIM, value: float = 0.5) -> np.ndarray:
    return np.full((m, dim), value, dtype=np.float32)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mutations") / "graph"
    build_store(EDGES, N, DIM, id_kind="sparse", seed=3, path=path)
    return path


@pytest.fixture
def live(base_dir, tmp_path):
    path = tmp_path / "graph"
    shutil.copytree(base_dir, path)
    return LiveGraph(path, with_features=True)


def bad_batches(ids: list[int], edges: list[tuple[int, int]]) -> dict[str, tuple]:
    """name -> (batch factory, message regex); ``ids``/``edges`` are the graph's, in
    external IDs. A valid mutation precedes the bad one where the kind has an index."""
    a, b, c = ids[0], ids[1], ids[2]
    e0 = edges[0]
    non_edge = next((s, d) for s in ids for d in ids if (s, d) not in edges)
    unknown = 99_999
    return {
        "add_edges.src unknown": (
            lambda: MutationBatch(add_src=[a, unknown], add_dst=[b, c]),
            rf"add_edges\.src\[1\]: node ID {unknown} is not in the graph",
        ),
        "add_edges.dst unknown": (
            lambda: MutationBatch(add_src=[a, b], add_dst=[c, unknown]),
            rf"add_edges\.dst\[1\]: node ID {unknown} is not in the graph",
        ),
        "remove_edges.src unknown": (
            lambda: MutationBatch(remove_src=[e0[0], unknown], remove_dst=[e0[1], a]),
            rf"remove_edges\.src\[1\]: node ID {unknown} is not in the graph",
        ),
        "remove_edges.dst unknown": (
            lambda: MutationBatch(remove_src=[e0[0], a], remove_dst=[e0[1], unknown]),
            rf"remove_edges\.dst\[1\]: node ID {unknown} is not in the graph",
        ),
        "set_features unknown": (
            lambda: MutationBatch(set_node_ids=[a, unknown], set_features=rows(2)),
            rf"set_features\[1\]: node ID {unknown} is not in the graph",
        ),
        "remove an edge of a new node": (
            lambda: MutationBatch(
                add_node_ids=[700], add_node_features=rows(1), remove_src=[700], remove_dst=[a]
            ),
            r"remove_edges\.src\[0\]: node ID 700 is not in the graph",
        ),
        "duplicate new ID": (
            lambda: MutationBatch(add_node_ids=[700, 701, 700], add_node_features=rows(3)),
            r"add_nodes\[2\]: node ID 700 is given twice \(also add_nodes\[0\]\)",
        ),
        "existing new ID": (
            lambda: MutationBatch(add_node_ids=[700, b], add_node_features=rows(2)),
            rf"add_nodes\[1\]: node ID {b} is already in the graph",
        ),
        "new nodes without features": (
            lambda: MutationBatch(add_node_ids=[700]),
            r"add_nodes: 1 node\(s\) given without features",
        ),
        "features without nodes": (
            lambda: MutationBatch(add_node_features=rows(1), add_src=[a], add_dst=[b]),
            r"add_nodes: features have shape \[1, 3\], expected \[0, 3\]",
        ),
        "add_nodes feature width": (
            lambda: MutationBatch(add_node_ids=[700], add_node_features=rows(1, DIM + 1)),
            rf"add_nodes: feature width {DIM + 1} does not match the graph's {DIM}",
        ),
        "set_features feature width": (
            lambda: MutationBatch(set_node_ids=[a], set_features=rows(1, DIM - 1)),
            rf"set_features: feature width {DIM - 1} does not match the graph's {DIM}",
        ),
        "set_features row count": (
            lambda: MutationBatch(set_node_ids=[a, b], set_features=rows(1)),
            r"set_features: features have shape \[1, 3\], expected \[2, 3\]",
        ),
        "integer features": (
            lambda: MutationBatch(set_node_ids=[a], set_features=np.ones((1, DIM), np.int64)),
            r"set_features: features must be floating point",
        ),
        "ragged features": (
            lambda: MutationBatch(set_node_ids=[a, b], set_features=[[1.0] * DIM, [1.0]]),
            r"set_features: features are not a \[2, 3\] array",
        ),
        "NaN in add_nodes": (
            lambda: MutationBatch(
                add_node_ids=[700, 701],
                add_node_features=np.array([[0.0] * DIM, [0.0, np.nan, 0.0]], np.float32),
            ),
            r"add_nodes\[1\]: features hold NaN or Inf",
        ),
        "Inf in set_features": (
            lambda: MutationBatch(
                set_node_ids=[a, b],
                set_features=np.array([[0.0] * DIM, [np.inf, 0.0, 0.0]], np.float32),
            ),
            r"set_features\[1\]: features hold NaN or Inf",
        ),
        "beyond float32": (
            lambda: MutationBatch(set_node_ids=[a], set_features=np.full((1, DIM), 1e39)),
            r"set_features\[0\]: features hold NaN or Inf",
        ),
        "add_edges lengths": (
            lambda: MutationBatch(add_src=[a, b], add_dst=[c]),
            r"add_edges: 2 sources but 1 destinations",
        ),
        "remove_edges lengths": (
            lambda: MutationBatch(remove_src=[e0[0]], remove_dst=[e0[1], a]),
            r"remove_edges: 1 sources but 2 destinations",
        ),
        "remove a non-edge": (
            lambda: MutationBatch(remove_src=[e0[0], non_edge[0]], remove_dst=[e0[1], non_edge[1]]),
            rf"remove_edges\[1\]: {non_edge[0]} -> {non_edge[1]} is not an edge of the graph",
        ),
        "remove a pair the batch adds": (
            lambda: MutationBatch(
                add_src=[non_edge[0]],
                add_dst=[non_edge[1]],
                remove_src=[non_edge[0]],
                remove_dst=[non_edge[1]],
            ),
            rf"remove_edges\[0\]: {non_edge[0]} -> {non_edge[1]} is not an edge",
        ),
        "key too long": (
            lambda: MutationBatch(
                add_src=[a], add_dst=[b], idempotency_key="k" * (MAX_KEY_CHARS + 1)
            ),
            r"idempotency_key must be at most 128 printable characters",
        ),
        "key not printable": (
            lambda: MutationBatch(add_src=[a], add_dst=[b], idempotency_key="retry\n1"),
            r"idempotency_key must be at most 128 printable characters",
        ),
        "key not a string": (
            lambda: MutationBatch(add_src=[a], add_dst=[b], idempotency_key=7),
            r"idempotency_key",
        ),
        "fractional ID": (
            lambda: MutationBatch(add_src=[a + 0.9], add_dst=[b]),
            r"add_edges\.src: node IDs must be integers, got float64",
        ),
        "NaN ID": (
            lambda: MutationBatch(set_node_ids=[np.nan], set_features=rows(1)),
            r"set_features: node IDs must be integers",
        ),
        "ID beyond int64": (
            lambda: MutationBatch(
                add_node_ids=np.array([5, 2**63 + 5], np.uint64), add_node_features=rows(2)
            ),
            r"add_nodes\[1\]: node ID 9223372036854775813 does not fit in int64",
        ),
        "2-D IDs": (
            lambda: MutationBatch(remove_src=[[e0[0]]], remove_dst=[e0[1]]),
            r"remove_edges\.src: node IDs must be 1-D",
        ),
        "empty batch": (lambda: MutationBatch(), r"the batch holds no mutation"),
    }


def graph_ids_edges(live: LiveGraph) -> tuple[list[int], list[tuple[int, int]]]:
    g = NaiveGraph.of_snapshot(live.snapshot)
    return g.ids, sorted(g.edges)


CASES = sorted(bad_batches([1, 2, 3], [(1, 2)]))


@pytest.mark.parametrize("case", CASES)
def test_bad_batch_is_refused_whole(live: LiveGraph, case: str) -> None:
    # one valid batch first, so the log and the features are not at their base state
    ids, edges = graph_ids_edges(live)
    live.apply(
        MutationBatch(
            add_node_ids=[600],
            add_node_features=rows(1, value=2.0),
            add_src=[600],
            add_dst=[ids[0]],
        )
    )
    ids, edges = graph_ids_edges(live)
    make, pattern = bad_batches(ids, edges)[case]
    seq, log_bytes = live.seq, live.log.path.read_bytes()
    state, snap = live_state(live), live.snapshot
    with pytest.raises(InvalidUpdateError, match=pattern):
        live.apply(make())
    assert live.seq == seq and live.snapshot is snap
    assert live.log.path.read_bytes() == log_bytes
    after = live_state(live)
    assert after.ids == state.ids and after.edges == state.edges
    for v in state.ids:
        np.testing.assert_array_equal(after.features[v], state.features[v])
    # the graph still takes a valid batch, and a reopened copy agrees
    live.apply(MutationBatch(set_node_ids=[ids[1]], set_features=rows(1, value=-1.0)))
    reopened = LiveGraph(live.path, with_features=True)
    assert reopened.seq == seq + 1
    assert live_state(reopened).edges == live_state(live).edges


def corrupt(rnd: random.Random, batch: MutationBatch, g: NaiveGraph) -> tuple[MutationBatch, str]:
    """One bad mutation planted in a valid batch; returns it and the message to expect."""
    present = set(g.ids)
    unknown = max(present | set(batch.add_node_ids.tolist())) + 1 + rnd.randrange(50)
    kind = rnd.choice(["add_src", "add_dst", "set", "dup", "existing", "nan", "width", "nonedge"])
    if kind in ("add_src", "add_dst"):
        arr = getattr(batch, kind).tolist()
        other = "add_dst" if kind == "add_src" else "add_src"
        i = rnd.randint(0, len(arr))
        arr.insert(i, unknown)
        brr = getattr(batch, other).tolist()
        brr.insert(i, g.ids[0])
        setattr(batch, kind, np.array(arr, np.int64))
        setattr(batch, other, np.array(brr, np.int64))
        what = "add_edges.src" if kind == "add_src" else "add_edges.dst"
        return batch, rf"{re.escape(what)}\[{i}\]: node ID {unknown} is not in the graph"
    if kind == "set":
        arr = batch.set_node_ids.tolist()
        i = rnd.randint(0, len(arr))
        arr.insert(i, unknown)
        feats = np.insert(np.zeros((len(arr) - 1, DIM), np.float32), i, 0.0, axis=0)
        batch.set_node_ids, batch.set_features = np.array(arr, np.int64), feats
        return batch, rf"set_features\[{i}\]: node ID {unknown} is not in the graph"
    if kind == "dup" and batch.add_node_ids.size:
        arr = batch.add_node_ids.tolist()
        j = rnd.randrange(len(arr))
        arr.append(arr[j])
        batch.add_node_ids = np.array(arr, np.int64)
        batch.add_node_features = np.zeros((len(arr), DIM), np.float32)
        return batch, rf"add_nodes\[{len(arr) - 1}\]: node ID {arr[j]} is given twice"
    if kind == "existing":
        arr = batch.add_node_ids.tolist()
        i = rnd.randint(0, len(arr))
        taken = rnd.choice(g.ids)
        arr.insert(i, taken)
        batch.add_node_ids = np.array(arr, np.int64)
        batch.add_node_features = np.zeros((len(arr), DIM), np.float32)
        return batch, rf"add_nodes\[{i}\]: node ID {taken} is already in the graph"
    if kind == "nan" and batch.set_node_ids.size:
        i = rnd.randrange(batch.set_node_ids.size)
        batch.set_features = batch.set_features.copy()
        batch.set_features[i, rnd.randrange(DIM)] = rnd.choice([np.nan, np.inf, -np.inf])
        return batch, rf"set_features\[{i}\]: features hold NaN or Inf"
    if kind == "width" and batch.set_node_ids.size:
        batch.set_features = np.zeros((batch.set_node_ids.size, DIM + 2), np.float32)
        return batch, r"set_features: feature width 5 does not match"
    non_edges = [(s, d) for s in sorted(present) for d in sorted(present) if (s, d) not in g.edges]
    if not non_edges:  # a complete graph: fall back to an unknown endpoint
        batch.add_src = np.append(batch.add_src, unknown)
        batch.add_dst = np.append(batch.add_dst, g.ids[0])
        return batch, rf"add_edges\.src\[{batch.add_src.size - 1}\]: node ID {unknown}"
    s, d = rnd.choice(non_edges)
    i = rnd.randint(0, batch.remove_src.size)
    batch.remove_src = np.insert(batch.remove_src, i, s)
    batch.remove_dst = np.insert(batch.remove_dst, i, d)
    return batch, rf"remove_edges\[{i}\]: {s} -> {d} is not an edge of the graph"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 8),
    edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20),
    id_kind=st.sampled_from(ID_KINDS),
    rnd=st.randoms(use_true_random=False),
)
def test_one_bad_mutation_in_a_valid_batch_is_named(n, edges, id_kind, rnd) -> None:
    edges = [(s, d) for s, d in edges if s < n and d < n]
    store = build_store(edges, n, DIM, id_kind=id_kind, seed=rnd.randrange(100))
    snap = GraphSnapshot.of(store.topology)
    g = NaiveGraph.of_store(store)
    batch = random_batch(rnd, g, DIM)
    resolve(batch, snap, 1)  # valid as drawn
    bad, pattern = corrupt(rnd, batch, g)
    with pytest.raises(InvalidUpdateError, match=pattern):
        resolve(bad, snap, 1)


def assert_same_resolved(a, b) -> None:
    assert (a.seq, a.num_nodes_before, a.idempotency_key) == (
        b.seq,
        b.num_nodes_before,
        b.idempotency_key,
    )
    for name in (
        "new_node_ids", "new_features", "remove_src", "remove_dst", "add_src", "add_dst",
        "set_nodes", "set_features",
    ):  # fmt: skip
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 8),
    edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20),
    key=st.text(
        st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
        | st.just(" "),
        max_size=MAX_KEY_CHARS,
    ),
    rnd=st.randoms(use_true_random=False),
)
def test_encode_decode_round_trip(n, edges, key, rnd) -> None:
    edges = [(s, d) for s, d in edges if s < n and d < n]
    store = build_store(edges, n, DIM, id_kind=rnd.choice(ID_KINDS), seed=rnd.randrange(100))
    snap = GraphSnapshot.of(store.topology)
    g = NaiveGraph.of_store(store)
    assert key.isprintable()
    batch = random_batch(rnd, g, DIM, key=key)
    resolved = resolve(batch, snap, seq=rnd.randrange(1, 2**40))
    data = encode(resolved)
    assert_same_resolved(decode(data, DIM), resolved)
    # a record cut short, or with bytes after it, is refused (never misread)
    for cut in sorted({0, 1, 10, len(data) // 2, len(data) - 1}):
        if cut < len(data):
            with pytest.raises(ValueError):
                decode(data[:cut], DIM)
    with pytest.raises(ValueError, match="trailing bytes"):
        decode(data + b"\0", DIM)


def test_idempotency_key_makes_a_retry_safe(live: LiveGraph) -> None:
    ids, _ = graph_ids_edges(live)
    batch = MutationBatch(add_src=[ids[0]], add_dst=[ids[1]], idempotency_key="once")
    first = live.apply(batch)
    again = live.apply(batch)
    assert again.replayed and again.seq == first.seq == live.seq == 1
    assert (
        live_state(live).edges[(ids[0], ids[1])]
        == 1
        + NaiveGraph.of_store(build_store(EDGES, N, DIM, id_kind="sparse", seed=3)).edges[
            (ids[0], ids[1])
        ]
    )
    # a reopened graph knows the key from the log
    reopened = LiveGraph(live.path, with_features=True)
    assert reopened.apply(batch).replayed and reopened.seq == 1


def test_set_features_last_row_wins_and_new_nodes_take_rows(live: LiveGraph) -> None:
    ids, _ = graph_ids_edges(live)
    batch = MutationBatch(
        add_node_ids=[800],
        add_node_features=rows(1, value=3.0),
        set_node_ids=[ids[0], 800, ids[0]],
        set_features=np.array([[1.0] * DIM, [4.0] * DIM, [2.0] * DIM], np.float32),
    )
    live.apply(batch)
    state = live_state(live)
    np.testing.assert_array_equal(state.features[ids[0]], [2.0] * DIM)
    np.testing.assert_array_equal(state.features[800], [4.0] * DIM)
    assert state.ids[-1] == 800
