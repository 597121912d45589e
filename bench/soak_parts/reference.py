"""The reference rows every served row is compared with, and the comparison itself."""

from __future__ import annotations

import time
from typing import Any

import harness
import numpy as np

# Tolerance of tests/support.assert_exact: |got - want| <= RTOL·|want| + max(ATOL, ULPS·ε·scale),
# scale = max |reference| over the whole reference tensor, ε = float32 machine epsilon.
ATOL, RTOL, ULPS = 1e-5, 1e-4, 64
EPS32 = float(np.finfo(np.float32).eps)


class RowChecker:
    """Compares served rows with the reference (``assert_exact``'s tolerance), by external ID.

    Args:
        ids: External node IDs, row ``i`` of ``ref`` belongs to ``ids[i]``.
        ref: ``[N, d]`` float32 reference embeddings.
    """

    def __init__(self, ids: np.ndarray, ref: np.ndarray) -> None:
        order = np.argsort(ids, kind="stable")
        self.sorted_ids = np.ascontiguousarray(ids[order])
        self.ref = np.ascontiguousarray(ref[order]).astype(np.float64)
        finite = self.ref[np.isfinite(self.ref)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        self.floor = max(ATOL, ULPS * EPS32 * scale)

    def reference(self, nodes: np.ndarray) -> np.ndarray:
        """Reference rows of external IDs ``nodes`` (float64)."""
        return self.ref[np.searchsorted(self.sorted_ids, nodes)]

    def wrong_rows(self, got: np.ndarray, want: np.ndarray) -> int:
        """Rows of ``got`` with any element outside the tolerance around ``want``."""
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return int(want.shape[0])
        ok = np.abs(got - want) <= RTOL * np.abs(want) + self.floor  # NaN is never ok
        return int((~ok.all(axis=1)).sum())

    def wrong_vs_reference(self, nodes: np.ndarray, got: np.ndarray) -> int:
        """Rows of ``got`` (for ``nodes``) that differ from the reference."""
        return self.wrong_rows(got, self.reference(nodes))


def compute_reference(data: harness.SageData) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The model's own full-graph forward: ``(external ids, rows [N, d] float32, info)``.

    Runs ``GraphSAGE.forward(x, edge_index)`` on the whole stored graph (storage order) and
    cross-checks it against ``LayerwiseEvaluator(model, store).evaluate()``.
    """
    import torch

    from hopserve import GraphStore, LayerwiseEvaluator
    from hopserve.examples import GraphSAGE

    store = GraphStore.open(data.graph)
    model = GraphSAGE(**data.kwargs)
    model.load_state_dict(torch.load(data.weights, weights_only=True))
    model.eval()
    t = time.perf_counter()
    dst = torch.repeat_interleave(torch.arange(store.num_nodes), store.in_degrees)
    edge_index = torch.stack([store.indices.long(), dst])
    with torch.no_grad():
        ref = model(store.features.float(), edge_index).numpy().astype(np.float32)
    forward_s = time.perf_counter() - t
    ids = store.to_external(np.arange(store.num_nodes)).numpy().astype(np.int64)
    t = time.perf_counter()
    with torch.no_grad():
        engine = LayerwiseEvaluator(model, store).evaluate().numpy()  # ascending external ID
    engine_s = time.perf_counter() - t
    order = np.argsort(ids)
    rows = RowChecker(ids, ref)
    info = {
        "nodes": store.num_nodes,
        "edges": store.num_edges,
        "external_ids": f"sparse, {int(ids.min())}..{int(ids.max())}",
        "forward_s": round(forward_s, 3),
        "engine_s": round(engine_s, 3),
        "engine_vs_forward_max_abs": float(np.abs(engine - ref[order]).max()),
        "engine_vs_forward_wrong_rows": rows.wrong_rows(engine, ref[order]),
        "tolerance_floor": rows.floor,
    }
    return ids, ref, info
