"""Symmetrize adds only the missing reverse edges (regression: it used to double every edge).

Rule under test: the result is the elementwise maximum ``max(A, A^T)`` of the edge
multiplicities, i.e. for every ordered pair ``(s, d)``, ``s != d``, occurring ``c(s, d)``
times, ``max(0, c(s, d) - c(d, s))`` copies of ``(d, s)`` are added. Self-loops are never
mirrored; duplicates are kept as given unless ``dedup``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.worker.graph import GraphStore
from hopserve.worker.graph.build import MAX_NODES, build_csc


def _edge_multiset(csc) -> Counter:
    """Counter of ``(src, dst)`` over the CSC, in input node numbering."""
    n = csc.num_nodes
    perm = csc.perm if csc.perm is not None else np.arange(n)
    dst = np.repeat(np.arange(n), np.diff(csc.indptr))
    return Counter(zip(perm[csc.indices].tolist(), perm[dst].tolist(), strict=True))


def _max_rule(edges) -> Counter:
    """Reference: max(A, A^T) on multiplicities, self-loops as given (Python loops)."""
    c = Counter((int(s), int(d)) for s, d in edges)
    out = Counter(c)
    for (s, d), k in c.items():
        if s != d:
            out[(d, s)] = max(out[(d, s)], k)
    return out


def _symmetric_random(n: int, e: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random simple symmetric edge list (both directions of every pair, shuffled)."""
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = s != d
    pairs = np.unique(np.stack([np.minimum(s, d), np.maximum(s, d)])[:, keep], axis=1)
    src = np.concatenate([pairs[0], pairs[1]])
    dst = np.concatenate([pairs[1], pairs[0]])
    order = rng.permutation(src.size)
    return src[order], dst[order]


@pytest.mark.parametrize("reorder", [None, "rcmk"])
def test_already_symmetric_is_unchanged(reorder):
    # The Cora report: 10,556 symmetric edges became 21,112.
    src, dst = _symmetric_random(2708, 5278, seed=0)
    n, e = 2708, src.size
    plain = build_csc(src, dst, n, reorder=reorder)
    sym = build_csc(src, dst, n, symmetrize=True, reorder=reorder)
    assert sym.num_edges == e
    assert _edge_multiset(sym) == _edge_multiset(plain)
    assert sym.stats.reverse_edges_added == 0 and sym.stats.input_edges == e


def test_directed_gets_exactly_the_missing_reverses():
    src, dst = np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0])  # a directed 4-cycle
    csc = build_csc(src, dst, 4, symmetrize=True, reorder=None)
    assert _edge_multiset(csc) == Counter(
        {(0, 1): 1, (1, 2): 1, (2, 3): 1, (3, 0): 1, (1, 0): 1, (2, 1): 1, (3, 2): 1, (0, 3): 1}
    )
    assert csc.stats.reverse_edges_added == 4


def test_mixed_some_reverses_present():
    edges = [(0, 1), (1, 0), (1, 2), (3, 2), (2, 3), (4, 0)]
    src, dst = np.array(edges).T
    csc = build_csc(src, dst, 5, symmetrize=True, reorder=None)
    expect = Counter(edges) + Counter([(2, 1), (0, 4)])
    assert _edge_multiset(csc) == expect
    assert csc.stats.reverse_edges_added == 2


def test_self_loops_untouched():
    edges = [(0, 0), (0, 0), (1, 1), (0, 1)]
    src, dst = np.array(edges).T
    csc = build_csc(src, dst, 2, symmetrize=True, reorder=None)
    assert _edge_multiset(csc) == Counter({(0, 0): 2, (1, 1): 1, (0, 1): 1, (1, 0): 1})
    assert csc.stats.reverse_edges_added == 1


def test_duplicates_rule_max_of_both_directions():
    # (0,1) twice, (1,0) once -> one (1,0) added: both directions end with multiplicity 2.
    csc = build_csc([0, 0, 1], [1, 1, 0], 2, symmetrize=True, reorder=None)
    assert _edge_multiset(csc) == Counter({(0, 1): 2, (1, 0): 2})
    assert csc.stats.reverse_edges_added == 1
    # (0,1) twice, no (1,0) -> two (1,0) added (duplicates mirrored as given).
    csc = build_csc([0, 0], [1, 1], 2, symmetrize=True, reorder=None)
    assert _edge_multiset(csc) == Counter({(0, 1): 2, (1, 0): 2})
    assert csc.stats.reverse_edges_added == 2
    # (0,1) and (1,0) once each: nothing to add.
    csc = build_csc([0, 1], [1, 0], 2, symmetrize=True, reorder=None)
    assert csc.num_edges == 2 and csc.stats.reverse_edges_added == 0
    # with dedup: one copy of each direction
    csc = build_csc([0, 0, 1], [1, 1, 0], 2, symmetrize=True, dedup=True, reorder=None)
    assert _edge_multiset(csc) == Counter({(0, 1): 1, (1, 0): 1})
    assert csc.stats.duplicates_removed == 2


def test_stats_of_every_transform():
    edges = [(0, 1), (0, 1), (2, 2), (1, 2)]
    src, dst = np.array(edges).T
    csc = build_csc(src, dst, 4, symmetrize=True, add_self_loops=True, dedup=True, reorder=None)
    st_ = csc.stats
    assert (st_.input_edges, st_.reverse_edges_added, st_.self_loops_added) == (4, 3, 3)
    # 4 + 3 + 3 = 10 edges before dedup: (0,1)x2 and (1,0)x2 collapse -> 2 removed
    assert st_.duplicates_removed == 2 and csc.num_edges == 8
    plain = build_csc(src, dst, 4, reorder=None)
    assert plain.stats.reverse_edges_added == 0 and plain.stats.input_edges == 4


def test_result_is_symmetric_multigraph():
    rng = np.random.default_rng(5)
    n = 50
    src, dst = rng.integers(0, n, 600), rng.integers(0, n, 600)  # many duplicates
    csc = build_csc(src, dst, n, symmetrize=True, reorder="rcmk")
    m = _edge_multiset(csc)
    assert all(m[(d, s)] == k for (s, d), k in m.items())
    assert m == _max_rule(zip(src.tolist(), dst.tolist(), strict=True))
    assert csc.stats.reverse_edges_added == csc.num_edges - src.size


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 8),
    edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=40),
)
def test_property_matches_max_rule(n, edges):
    edges = [(s % n, d % n) for s, d in edges]
    src = np.array([s for s, _ in edges], dtype=np.int64)
    dst = np.array([d for _, d in edges], dtype=np.int64)
    csc = build_csc(src, dst, n, symmetrize=True, reorder=None)
    expect = _max_rule(edges)
    assert _edge_multiset(csc) == expect
    assert csc.stats.reverse_edges_added == sum(expect.values()) - len(edges)


def test_missing_reverse_keys_no_overflow_at_max_nodes():
    from hopserve.worker.graph.build import missing_reverse_keys

    # Keys dst * N + src approach 2**63 - 1 at N = MAX_NODES; pair keys use uint64.
    n = MAX_NODES
    edges = [
        (n - 1, 0),  # has its reverse (next)
        (0, n - 1),
        (n - 2, n - 1),  # "up" edge lacking its reverse
        (n - 1, n - 3),  # "down" edge lacking its reverse, twice
        (n - 1, n - 3),
        (n - 1, n - 1),  # self-loop: never mirrored
    ]
    s = np.array([e[0] for e in edges], dtype=np.int64)
    d = np.array([e[1] for e in edges], dtype=np.int64)
    add = missing_reverse_keys(s, d, n)
    expect = sorted([(n - 2) * n + (n - 1)] + [(n - 1) * n + (n - 3)] * 2)  # Python ints
    assert add.dtype == np.int64 and add.tolist() == expect


def test_from_edge_index_symmetric_unchanged():
    src, dst = _symmetric_random(300, 900, seed=2)
    ei = torch.from_numpy(np.stack([src, dst]))
    x = torch.randn(300, 4)
    plain = GraphStore.from_edge_index(ei, x, reorder=None)
    sym = GraphStore.from_edge_index(ei, x, reorder=None, symmetrize=True)
    assert sym.num_edges == plain.num_edges == src.size
    assert torch.equal(sym.indptr, plain.indptr) and torch.equal(sym.indices, plain.indices)


# ---------------------------------------------------------------------------- ingest + CLI
@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    feats = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", feats)
    edges = tmp_path / "e.csv"
    # (0,1)/(1,0) and (2,3)/(3,2) symmetric; (1,2) and (4,0) lack their reverse
    edges.write_text("0,1\n1,0\n2,3\n3,2\n1,2\n4,0\n")
    sym = tmp_path / "sym.csv"
    sym.write_text("0,1\n1,0\n2,3\n3,2\n")
    return {"features": tmp_path / "x.npy", "edges": edges, "sym": sym}


def test_ingest_with_stats_reports_added(tmp_path, files, caplog):
    from hopserve.worker.graph.ingestion import ingest_with_stats

    caplog.set_level("INFO", logger="hopserve.worker.graph.build")
    res = ingest_with_stats(
        files["edges"], files["features"], out=tmp_path / "g", symmetrize=True, progress=False
    )
    assert res.stats.reverse_edges_added == 2 and res.stats.input_edges == 6
    assert res.store.num_edges == 8 and GraphStore.open(tmp_path / "g").num_edges == 8
    assert "added 2 reverse edges" in caplog.text
    res = ingest_with_stats(
        files["sym"], files["features"], out=tmp_path / "h", symmetrize=True, progress=False
    )
    assert res.stats.reverse_edges_added == 0 and res.store.num_edges == 4


def _cli(*args: object):
    return CliRunner().invoke(app, ["ingest", *map(str, args), "--no-progress"])


def test_cli_ingest_symmetrize_prints_count(tmp_path, files):
    res = _cli(
        "--edges", files["edges"], "--features", files["features"], "--out", tmp_path / "g",
        "--symmetrize",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = res.stdout.splitlines()[-1]
    assert summary == "edges: 6 read; symmetrize added 2 reverse edges; 8 stored"
    assert GraphStore.open(tmp_path / "g").num_edges == 8
    res = _cli(
        "--edges", files["sym"], "--features", files["features"], "--out", tmp_path / "h",
        "--symmetrize",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "symmetrize added 0 reverse edges" in res.stdout
    assert GraphStore.open(tmp_path / "h").num_edges == 4
    res = _cli("--edges", files["sym"], "--features", files["features"], "--out", tmp_path / "k")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == "edges: 4 read; 4 stored"


# ---------------------------------------------------------------------------- synth
def test_synth_symmetrize_keeps_documented_edge_count():
    from hopserve.worker.graph.synth import rmat_edges, synth_powerlaw

    # documented: half of N * avg_degree edges are generated, then every non-loop is mirrored
    n, deg = 2000, 8
    m = round(n * deg / 2)
    src, dst = rmat_edges(n, m, seed=0)
    g = synth_powerlaw(n, deg, 2, symmetrize=True, reorder=None, progress=False)
    assert g.num_edges == m + int((src != dst).sum())
    assert torch.equal(g.in_degrees, g.out_degrees)
