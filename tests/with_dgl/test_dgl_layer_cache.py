"""The layer cache with DGL models: reused hub rows leave every result equal to the
model's own full-graph forward (the engine side is shared with PyG models:
tests/worker/engine/test_layer_cache.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

dgl = pytest.importorskip("dgl", reason="needs DGL: run in .venv-dgl (make dgl-env)")

from support import assert_exact  # noqa: E402
from support.dgl_models import DGL, FAMILIES, build  # noqa: E402
from support.exactness import D_IN, MEDIUM_TARGETS  # noqa: E402

from hopserve import LayerwiseEvaluator  # noqa: E402
from hopserve.worker.engine.layer_cache import LayerCache, cacheable_boundaries  # noqa: E402

pytestmark = pytest.mark.dgl


def _never_stale(layer: int, nodes: np.ndarray) -> np.ndarray:
    return np.zeros(nodes.shape, dtype=np.int64)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_reused_hub_rows_are_exact(family, medium_graph):
    edge_index, x, store = medium_graph
    model = build(family, D_IN, seed=3)
    want = DGL.forward(model, edge_index, x)
    ev = LayerwiseEvaluator(model, store, init_batch_nodes=97, progress=False)
    if not cacheable_boundaries(ev.split):
        pytest.skip(f"{family}: no cacheable boundary")
    cache = LayerCache(ev.split, store.topology.in_degrees, 400)
    rng = np.random.default_rng(1)
    reused = 0
    for k in range(5):
        ids = [*MEDIUM_TARGETS, *rng.integers(0, x.shape[0], 3 * k).tolist()]
        storage = store.to_storage(torch.tensor(ids))
        plan = ev.plan(storage, reusable=cache.reusable(0, _never_stale, store.num_nodes))
        reuse = cache.reuse(
            {layer: f.reused for layer, f in enumerate(plan.layers) if f.reused is not None}, 0
        )
        got = ev.evaluate_plan(plan, storage, reuse)
        assert_exact(got, want[ids], f"{family} job {k}")
        reused += reuse.reused
    assert reused > 0
