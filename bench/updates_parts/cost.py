"""Where an update's time goes, measured in this process on a private copy of the graph.

The service answers an update after: resolving it against the current snapshot, splicing
the next snapshot (one copy of the CSC and of the out-edge CSR: ``O(N + E)``), appending
it to the update log with one ``fsync``, and computing the exact invalidation set of each
model kind (``affected_nodes``: the L-hop out-neighbourhood). These are the same functions
the service calls (``hopserve.worker.graph.live``), timed one by one on the base snapshot
(the graph is not advanced; each batch is measured against the same snapshot).

For GCN the invalidation set is also computed as if only in-degrees counted (the sources of
new edges keep their degree: PyG's ``gcn_norm`` normalizes by in-degrees), the set a
narrower rule would invalidate.

Also timed: what a GCN model pays per new graph sequence before its first job there
(``GCNAdapter.prepare``, the whole-graph degree normalization), and the first update of
a process (it builds the out-edge CSR).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .phases import log, pct
from .service import private_graph

KINDS = {"sage": (2, False, False), "gcn": (2, True, False)}
"""Each model's invalidation kind: (layers, degree-normalized, reads source degrees):
PyG's GCN reads in-degrees only."""


def update_cost(
    graph: Path,
    work: Path,
    sizes: tuple[int, ...],
    reps: int,
    hubs: dict[str, int],
    hidden: int,
    seed: int = 5,
) -> dict[str, Any]:
    """Per batch size: seconds of resolve, splice, log append + fsync, invalidation (per
    kind); rows invalidated and invalidation rows/s; the hub edges; GCN's per-sequence
    preparation."""
    from hopserve.worker.graph.live import LiveGraph, MutationBatch
    from hopserve.worker.graph.live.invalidation import affected_nodes
    from hopserve.worker.graph.live.log import UpdateLog
    from hopserve.worker.graph.live.mutations import encode, resolve
    from hopserve.worker.graph.live.snapshot import apply_batch

    copy = private_graph(graph, Path(work) / "cost-graph")
    live = LiveGraph(copy, with_features=True)
    for kind in KINDS.values():
        live.track(kind)
    snap = live.snapshot
    ids = snap.to_external(np.arange(snap.num_nodes))
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"num_nodes": snap.num_nodes, "num_edges": snap.num_edges}

    t = time.perf_counter()
    live.apply(MutationBatch(add_src=ids[:1], add_dst=ids[1:2]))
    out["first_update_s"] = time.perf_counter() - t  # builds the out-edge CSR
    snap = live.snapshot
    scratch = UpdateLog(Path(work) / "cost.log")
    seq = 0

    def measure(src: np.ndarray, dst: np.ndarray) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        batch = MutationBatch(add_src=src, add_dst=dst)
        t0 = time.perf_counter()
        resolved = resolve(batch, snap, snap.seq + 1)
        t1 = time.perf_counter()
        nxt = apply_batch(snap, resolved)
        t2 = time.perf_counter()
        scratch.append(seq, encode(resolved))
        t3 = time.perf_counter()
        row: dict[str, Any] = {
            "mutations": int(src.size),
            "resolve_s": t1 - t0,
            "splice_s": t2 - t1,
            "log_fsync_s": t3 - t2,
        }
        for name, kind in KINDS.items():
            s = time.perf_counter()
            rows = affected_nodes(nxt, resolved, *kind).size
            row[f"invalidate_{name}_s"] = time.perf_counter() - s
            row[f"rows_{name}"] = int(rows)
        # Before the service told in-degrees from source degrees, GCN's set also seeded
        # N_out(S): kept as a column to show what that cost.
        s = time.perf_counter()
        row["rows_gcn_in_degree"] = int(affected_nodes(nxt, resolved, 2, True, True).size)
        row["invalidate_gcn_in_degree_s"] = time.perf_counter() - s
        row["invalidate_s"] = sum(row[f"invalidate_{n}_s"] for n in KINDS)
        row["rows"] = sum(row[f"rows_{n}"] for n in KINDS)
        row["total_s"] = t3 - t0 + row["invalidate_s"]
        return row

    per_size = {}
    for k in sizes:
        rows = [
            measure(ids[rng.integers(ids.size, size=k)], ids[rng.integers(ids.size, size=k)])
            for _ in range(reps)
        ]
        keys = [key for key in rows[0] if key != "mutations"]
        per_size[str(k)] = {key: float(np.median([r[key] for r in rows])) for key in keys}
        per_size[str(k)]["mutations"] = k
        total = per_size[str(k)]
        log(
            f"cost: {k} edges/batch: {total['total_s'] * 1e3:.1f} ms "
            f"(splice {total['splice_s'] * 1e3:.1f}, fsync {total['log_fsync_s'] * 1e3:.1f}, "
            f"invalidation {total['invalidate_s'] * 1e3:.1f} ms for {total['rows']:.0f} rows)"
        )
    out["per_batch_size"] = per_size
    r = lambda: ids[rng.integers(ids.size, size=1)]  # noqa: E731
    out["hubs"] = {
        "random → max out-degree node": measure(r(), np.asarray([hubs["out_hub"]])),
        "max out-degree node → random": measure(np.asarray([hubs["out_hub"]]), r()),
        "random → max in-degree node": measure(r(), np.asarray([hubs["in_hub"]])),
    }
    inv_rows = sum(v["rows"] for v in per_size.values())
    inv_s = sum(v["invalidate_s"] for v in per_size.values())
    out["invalidation_rows_per_s"] = inv_rows / inv_s if inv_s else float("nan")
    out["gcn_prepare"] = _gcn_prepare(live, ids, rng, hidden)
    scratch.close()
    return out


def _gcn_prepare(live: Any, ids: np.ndarray, rng: np.random.Generator, hidden: int) -> dict:
    """Seconds of ``GCNAdapter.prepare`` for the current sequence, then for 3 new ones."""
    from torch_geometric.nn import GCNConv

    from hopserve.worker.convs.gcn import GCNAdapter
    from hopserve.worker.graph.live import MutationBatch

    adapter = GCNAdapter(GCNConv(live.snapshot.feature_dim, hidden))
    with live.reading():
        store = live.store()
    t = time.perf_counter()
    adapter.prepare(store)
    first = time.perf_counter() - t
    per_seq = []
    for _ in range(3):
        live.apply(MutationBatch(add_src=ids[rng.integers(ids.size, size=10)],
                                 add_dst=ids[rng.integers(ids.size, size=10)]))  # fmt: skip
        with live.reading():
            store = live.store()
        t = time.perf_counter()
        adapter.prepare(store)
        per_seq.append(time.perf_counter() - t)
    return {"first_s": first, "per_new_sequence_s": pct(per_seq, (50,))["p50"],
            "layers": 2}  # fmt: skip
