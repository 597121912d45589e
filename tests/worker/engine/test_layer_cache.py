"""The layer cache: reused intermediate rows leave every result equal to the full forward.

Runs go through the evaluator as a worker drives it (``reusable`` → plan → ``reuse`` →
``evaluate_plan``); the worker's own wiring, with graph updates, is
tests/worker/runtime/test_layer_reuse.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support import assert_exact
from support.exactness import D_IN, MEDIUM_TARGETS, PYG, examples, graphs
from support.models import build

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.engine.layer_cache import LayerCache, cacheable_boundaries
from hopserve.worker.graph.planner import plan_frontiers, segment_positions, sorted_union

CHAINS = ["gat", "gcn", "gin", "sage_max", "sage_mean", "transformer", "weight_shared"]


def _never_stale(layer: int, nodes: np.ndarray) -> np.ndarray:
    return np.zeros(nodes.shape, dtype=np.int64)


def run(ev: LayerwiseEvaluator, cache: LayerCache, ids, seq: int = 0, stale=_never_stale):
    """One job of external ``ids`` with the cache: its rows and the rows it reused."""
    storage = ev.graph.to_storage(torch.as_tensor(ids))
    reusable = cache.reusable(seq, stale, ev.graph.num_nodes)
    plan = ev.plan(storage, reusable=reusable)
    reuse = cache.reuse(
        {layer: f.reused for layer, f in enumerate(plan.layers) if f.reused is not None}, seq
    )
    out = ev.evaluate_plan(plan, storage, reuse)
    assert reuse.reused == sum(s.reused_rows for s in ev.last_stats.layers)
    return out, reuse.reused


def test_boundaries_are_where_only_the_layer_below_crosses():
    sage = LayerwiseEvaluator(build("sage_mean", D_IN), _tiny_store(), progress=False)
    assert sorted(cacheable_boundaries(sage.split)) == [1, 2]
    # Jumping knowledge: layer 1's output crosses boundary 2 to the final block.
    jk = LayerwiseEvaluator(build("jk_cat", D_IN), _tiny_store(), progress=False)
    assert sorted(cacheable_boundaries(jk.split)) == [1]
    # GCNII: every conv reads x_0 (block 0's output), so no boundary is crossed by the
    # layer below alone, and nothing is cached (a cached row would miss x_0's rows).
    gcnii = LayerwiseEvaluator(build("gcnii", D_IN), _tiny_store(), progress=False)
    assert sorted(cacheable_boundaries(gcnii.split)) == []
    # x_0 = the raw features: they come from the store at any layer, so boundaries stay.
    raw = LayerwiseEvaluator(build("gcnii_raw_x0", D_IN), _tiny_store(), progress=False)
    assert sorted(cacheable_boundaries(raw.split)) == [1]


def _tiny_store() -> GraphStore:
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    return GraphStore.from_edge_index(ei, torch.randn(4, D_IN))


@pytest.mark.parametrize("family", CHAINS + ["jk_cat", "gcnii_raw_x0"])
@examples(10)
@given(case=graphs(hub=True), capacity=st.integers(1, 45), later=st.lists(
    st.lists(st.integers(0, 39), min_size=1, max_size=8), min_size=1, max_size=3))  # fmt: skip
def test_random_graphs_with_reuse_equal_the_forward(family, case, capacity, later):
    edge_index, x, targets, reorder = case
    model = build(family, D_IN)
    want = PYG.forward(model, edge_index, x)
    store = GraphStore.from_edge_index(edge_index, x, reorder=reorder)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=3, self_check=False, progress=False)
    cache = LayerCache(ev.split, store.topology.in_degrees, capacity)
    n = x.shape[0]
    for ids in [targets.tolist(), *[[i % n for i in t] for t in later]]:
        got, _ = run(ev, cache, ids)
        assert_exact(got, want[ids], f"{family} with reuse")


@pytest.mark.parametrize("family", ["gcn", "sage_mean", "gat"])
def test_medium_graph_reuses_hub_rows_exactly(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    want = PYG.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    cache = LayerCache(ev.split, store.topology.in_degrees, 300)
    rng = np.random.default_rng(0)
    reused = []
    for k in range(6):
        ids = (
            [*MEDIUM_TARGETS, *rng.integers(0, x.shape[0], 4).tolist()] if k else [*MEDIUM_TARGETS]
        )
        got, hits = run(ev, cache, ids)
        assert_exact(got, want[ids], f"{family} job {k}")
        reused.append(hits)
    assert reused[0] == 0 and sum(reused[1:]) > 0, reused  # cold, then warm


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["gcn", "sage_mean", "gat"])
def test_cuda_reuses_hub_rows_exactly(family, medium_graph):
    """The cache keeps host rows of device outputs and writes them back on the device."""
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    want = PYG.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, device="cuda", init_batch_nodes=97, progress=False)
    cache = LayerCache(ev.split, store.topology.in_degrees, 300)
    hits = 0
    for k in range(4):
        ids = [*MEDIUM_TARGETS, k, 7 * k + 1]
        got, reused = run(ev, cache, ids)
        assert_exact(got.cpu(), want[ids], f"{family} on cuda, job {k}")
        hits += reused
    assert hits > 0


def test_reused_rows_are_the_rows_the_run_reads(medium_graph):
    """Corrupting the cached rows changes the answer: the run really takes them."""
    edge_index, x, store = medium_graph
    model = build("sage_mean", D_IN, seed=3)
    want = PYG.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    cache = LayerCache(ev.split, store.topology.in_degrees, 3000)
    ids = list(MEDIUM_TARGETS)
    run(ev, cache, ids)
    got, hits = run(ev, cache, ids)
    assert hits > 0
    assert_exact(got, want[ids], "warm")
    for table in cache._values[2].values():
        table += 1000.0
    bad, _ = run(ev, cache, ids)
    assert not torch.allclose(bad, want[ids], atol=1.0)


def test_a_row_is_reused_only_between_its_last_change_and_the_job():
    """stale_l(v) <= s <= t: s = the row's sequence, t = the job's."""
    ev = LayerwiseEvaluator(build("sage_mean", D_IN), _tiny_store(), progress=False)
    cache = LayerCache(ev.split, ev.graph.topology.in_degrees, 4)
    values = {name: torch.ones(4, 8) for name in cache.boundaries[1]}
    cache.reuse({}, 5).capture(1, None, None, values)  # every node, computed at sequence 5

    def valid(job_seq: int, last_change: int) -> np.ndarray:
        masks = cache.reusable(job_seq, lambda layer, v: np.full(v.shape, last_change), 4)
        return masks.get(1, np.zeros(4, bool))

    assert valid(5, 5).all() and valid(9, 3).all()
    assert not valid(4, 3).any()  # computed after the job's version
    assert not valid(9, 6).any()  # changed since it was computed
    # An older job's rows never replace newer ones.
    cache.reuse({}, 2).capture(1, None, None, {k: v * 0 for k, v in values.items()})
    assert (cache._seq[1] == 5).all()


def test_planner_stops_frontiers_at_reused_rows(medium_graph):
    _, _, store = medium_graph
    topo = store.topology
    targets = np.array(MEDIUM_TARGETS)
    mask = np.zeros(topo.num_nodes, dtype=bool)
    full = plan_frontiers(topo, targets, 3, shortcut=False)
    mask[full.layers[2].nodes[::2]] = True  # half of V^2 cached at layer 2
    plan = plan_frontiers(topo, targets, 3, shortcut=False, reusable={2: mask})
    v2 = plan.layers[2]
    assert np.array_equal(v2.nodes, full.layers[2].nodes)  # layer 3 still reads all of V^2
    assert np.array_equal(v2.reused, v2.nodes[mask[v2.nodes]])
    computed = v2.computed().nodes
    pos, _ = segment_positions(topo.indptr, computed)
    want = sorted_union(topo.num_nodes, computed, topo.indices[pos])
    assert np.array_equal(plan.layers[1].nodes, want)
    assert plan.layers[1].nodes.size < full.layers[1].nodes.size
    assert plan.sizes(topo.num_nodes)[2] == computed.size
    with pytest.raises(ValueError, match="sampling"):
        plan_frontiers(topo, targets, 3, fanouts=[2, 2, 2], reusable={2: mask})
