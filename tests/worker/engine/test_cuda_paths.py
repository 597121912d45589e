"""The engine's CUDA paths on a real GPU (skipped without one): every storage tier of the
layer outputs, the graph resident on the device, and the prefetch side stream.

Exactness is against the model's own full-graph forward on the CPU; the OOM path is in
``test_memory.py`` and the per-family CUDA runs in ``test_exactness.py``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from support import assert_exact, random_edge_index
from support.models import build

from hopserve import GraphStore, LayerwiseEvaluator

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N, D = 4000, 16


@pytest.fixture(scope="module")
def graph():
    edge_index = random_edge_index(N, 40_000, seed=11)
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(12))
    return edge_index, x, GraphStore.from_edge_index(edge_index, x)


def forward(model, edge_index, x):
    """The model's own forward on the CPU (on a copy: an evaluator moves its model to
    the GPU in place)."""
    with torch.no_grad():
        return copy.deepcopy(model).cpu()(x, edge_index)


TIERS = {
    "device": {},
    "host": {"device_tier_fraction": 0.0},
    "disk": {"device_tier_fraction": 0.0, "host_memory_budget_bytes": 0},
}


@pytest.mark.parametrize("tier", sorted(TIERS))
@pytest.mark.parametrize("family", ["gcn", "sage_mean", "gat"])
def test_every_storage_tier_is_exact(family, tier, graph, tmp_path):
    edge_index, x, store = graph
    model = build(family, D, seed=4)
    want = forward(model, edge_index, x)
    ev = LayerwiseEvaluator(
        model,
        store,
        device="cuda",
        init_batch_nodes=300,
        spill_dir=str(tmp_path),
        progress=False,
        **TIERS[tier],
    )
    assert_exact(ev.evaluate(), want, f"{family}, {tier} tier, full")
    assert set(ev.last_stats.tiers.values()) == {tier}, ev.last_stats.tiers
    targets = torch.tensor([N - 1, 0, 17, 1500, 17])
    assert_exact(ev.evaluate(targets=targets), want[targets], f"{family}, {tier} tier, partial")
    assert not list(tmp_path.iterdir()), "spill files outlived the run"


def test_resident_graph_reads_in_place_and_follows_the_store(graph):
    """Resident: every full layer of a SAGE model is gather-free (layer 1 reads the device
    features in place); a new store object is uploaded anew, never served from the old
    copy."""
    edge_index, x, store = graph
    model = build("sage_mean", D, seed=5)
    ev = LayerwiseEvaluator(model, store, device="cuda", graph_on_device=True, progress=False)
    assert ev.graph_resident
    assert_exact(ev.evaluate(), forward(model, edge_index, x), "resident full")
    assert all(layer.gather_free for layer in ev.last_stats.layers if layer.layer > 0)

    x2 = x.flip(0).contiguous()
    other = GraphStore.from_edge_index(edge_index, x2)
    ev.graph = other  # what a reload does: the evaluator now reads another store
    assert not ev.graph_resident
    assert_exact(ev.evaluate(), forward(model, edge_index, x2), "after the store changed")
    assert ev.graph_resident


def test_prefetch_copies_run_on_a_side_stream(graph, tmp_path):
    """Host-to-device copies of prefetched batches are issued on the copy stream, not on
    the stream the convs compute on; the overlap achieved is reported."""
    edge_index, x, store = graph
    model = build("sage_mean", D, seed=6)
    ev = LayerwiseEvaluator(
        model,
        store,
        device="cuda",
        prefetch=True,
        graph_on_device=False,
        device_tier_fraction=0.0,
        memory_budget_bytes=2 << 20,  # many small batches: something to overlap
        init_batch_nodes=200,
        progress=False,
    )
    ev.evaluate()  # warm up (kernels loaded, sizers learned)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        got = ev.evaluate()
    assert_exact(got, forward(model, edge_index, x), "prefetch on cuda")
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert copies and kernels, "the profiler saw no copies or no kernels"
    compute_streams = {e["args"]["stream"] for e in kernels}
    copy_streams = {e["args"]["stream"] for e in copies}
    side = copy_streams - compute_streams
    assert side, f"copies on {copy_streams}, kernels on {compute_streams}: no side stream"
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    overlap = sum(_overlap(c["ts"], c["ts"] + c["dur"], spans) for c in copies)
    busy = sum(c["dur"] for c in copies)
    print(
        f"\nprefetch: {len(copies)} copies, {overlap / max(busy, 1e-9):.0%} of copy time overlaps kernels"
    )


def _overlap(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)
