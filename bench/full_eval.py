"""Full-graph evaluation: hopserve vs a naive layer-wise loop vs node-wise (DGI Table 2).

One graph, one model, one run; each method runs in its own subprocess so its peak RSS
is its own. Methods:

* ``hopserve`` — LayerwiseEvaluator on the RCMK-ordered store (dynamic batches, SpMM
  adapters, prefetching).
* ``hopserve-unordered`` — the same engine on the store in its generated (unordered)
  numbering: what RCMK reordering contributes.
* ``naive`` — the hand-written layer-wise loop of DGL's GraphSAGE example ("DGL-manual"):
  fixed batch size, nodes in their original (unordered) numbering, the model's own convs
  called with ``edge_index``.
* ``nodewise`` — DGI Algorithm 1 (full L-hop neighbourhood per target batch), timed on a
  random sample of α·N targets and extrapolated as t/α.
* ``whole-graph`` — the model's own ``forward(x, edge_index)`` on the whole graph, as its
  user would call it (PyG materializes one message row per edge for SAGE);
  ``whole-graph-csr`` — the same forward with the transposed adjacency as a torch sparse
  CSR (PyG's fused SpMM path): the fastest whole-graph forward PyG offers. Either may run
  out of memory where the layer-wise methods do not; that is reported, not hidden.

On CUDA every method runs once untimed first (kernels, handles, the graph upload), and the
report adds each layer-wise run's share of the memory-bandwidth roofline: the bytes of
indices and input rows read and output rows written per layer, over the device's measured
copy bandwidth.

Outputs ``bench/results/full_eval.{json,md,png}``. Ratios are measured side by side in one
run; absolute times are only meaningful on the machine that produced them.

    python bench/full_eval.py                       # default: 200K nodes / 4M edges, CPU
    python bench/full_eval.py --nodes 2400000 --avg-degree 25 --dim 100 --device cuda \
        --family gcn --methods hopserve,naive,whole-graph,whole-graph-csr
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import harness

METHODS = ("hopserve", "hopserve-unordered", "naive", "whole-graph", "whole-graph-csr", "nodewise")
FAMILIES = ("sage", "gcn", "gat")
FAMILY_NAMES = {"sage": "GraphSAGE-mean", "gcn": "GCN", "gat": "GAT"}
GAT_HEADS = 4  # hidden GAT layers: GAT_HEADS heads of hidden / GAT_HEADS, concatenated
# Options the parent passes on to each method's child run.
CHILD_KEYS = (
    "nodes", "dim", "hidden", "out_dim", "layers", "device", "threads", "batch_size",
    "budget_mb", "nodewise_fraction", "nodewise_batch", "family",
)  # fmt: skip


# --------------------------------------------------------------------------- model
def make_model(d_in: int, hidden: int, d_out: int, layers: int, family: str = "sage"):
    """The benchmark's model, seeded: GraphSAGE (mean), GCN or GAT (hidden layers with
    :data:`GAT_HEADS` concatenated heads, one head out), ReLU between layers."""
    import torch
    from torch import nn
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    def conv(a: int, b: int, last: bool) -> nn.Module:
        if family == "gat":
            return GATConv(a, b, heads=1) if last else GATConv(a, b // GAT_HEADS, GAT_HEADS)
        return {"sage": SAGEConv, "gcn": GCNConv}[family](a, b)

    class GraphSAGE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dims = [d_in] + [hidden] * (layers - 1) + [d_out]
            pairs = list(zip(dims, dims[1:], strict=False))
            self.convs = nn.ModuleList(
                conv(a, b, i == len(pairs) - 1) for i, (a, b) in enumerate(pairs)
            )

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    torch.manual_seed(0)
    return GraphSAGE().eval()


def naive_layerwise(model, store, batch_size: int, device: str, family: str = "sage"):
    """DGL-manual: per layer, fixed-size batches of consecutive node ids, no reordering.

    GCN needs whole-graph degrees: PyG's own ``gcn_norm`` runs once on the whole graph (in
    the timed region), and each batch calls the conv with those edge weights and
    ``normalize`` off, on its sources (destinations included) as a square graph. GAT adds
    a self-loop per node, so it too runs on the square graph of each batch's nodes.
    """
    import torch

    n = store.num_nodes
    if family == "gcn":
        from torch_geometric.nn.conv.gcn_conv import gcn_norm

        ei, w = gcn_norm(store.edge_index(), None, n, add_self_loops=True)
        order = torch.argsort(ei[1], stable=True)
        indices, weights = ei[0][order], w[order]
        indptr = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(torch.bincount(ei[1], minlength=n), 0, out=indptr[1:])
    else:
        indptr, indices, weights = store.indptr, store.indices, None
    deg = indptr[1:] - indptr[:-1]
    h = store.features
    for i, conv in enumerate(model.convs):
        out = None
        for start in range(0, n, batch_size):
            end = min(n, start + batch_size)
            a, b = int(indptr[start]), int(indptr[end])
            src = indices[a:b].long()
            dst_local = torch.repeat_interleave(torch.arange(end - start), deg[start:end])
            with torch.no_grad():
                if family == "gat":
                    dst = torch.arange(start, end)
                    nodes, inverse = torch.unique(torch.cat([dst, src]), return_inverse=True)
                    at_dst = inverse[: end - start]
                    edge_index = torch.stack([inverse[end - start :], at_dst[dst_local]])
                    y = conv(h[nodes].float().to(device), edge_index.to(device))
                    y = y[at_dst.to(device)]
                elif weights is None:
                    nodes, inverse = torch.unique(src, return_inverse=True)
                    edge_index = torch.stack([inverse, dst_local]).to(device)
                    x_src = h[nodes].float().to(device)
                    x_dst = h[start:end].float().to(device)
                    y = conv((x_src, x_dst), edge_index)
                else:
                    dst = torch.arange(start, end)
                    nodes, inverse = torch.unique(torch.cat([dst, src]), return_inverse=True)
                    at_dst = inverse[: end - start]
                    edge_index = torch.stack([inverse[end - start :], at_dst[dst_local]])
                    conv.normalize = False
                    try:
                        y = conv(h[nodes].float().to(device), edge_index.to(device),
                                 weights[a:b].to(device))[at_dst.to(device)]  # fmt: skip
                    finally:
                        conv.normalize = True
                if i < len(model.convs) - 1:
                    y = y.relu()
            if out is None:
                out = torch.empty(n, y.shape[1])
            out[start:end] = y.cpu()
        h = out
    return h


def whole_graph(model, store, device: str, csr: bool):
    """The model's own forward on the whole graph on ``device``: ``edge_index``, or the
    transposed adjacency as torch sparse CSR (``csr``)."""
    import torch

    x = store.features.float().to(device)
    edge_index = store.edge_index().to(device)
    if csr:
        n = store.num_nodes
        adj_t = torch.sparse_csr_tensor(
            store.indptr.to(device),
            store.indices.long().to(device),
            torch.ones(store.num_edges, device=device),
            size=(n, n),
        )
        edge_index = adj_t
    with torch.no_grad():
        out = model(x, edge_index)
    return out.cpu()


def cuda_copy_bandwidth(device: str) -> float:
    """Bytes per second a device-to-device copy moves (read + write), median of 10."""
    import torch

    src = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * src.numel() * 4 / times[len(times) // 2]


# --------------------------------------------------------------------------- one method
def run_method(args: argparse.Namespace) -> dict[str, Any]:
    """Run one method in this process; print a JSON line with its measurements."""
    import numpy as np
    import torch

    from hopserve import GraphStore, LayerwiseEvaluator, NodewiseEvaluator

    torch.set_num_threads(args.threads)
    model = make_model(args.dim, args.hidden, args.out_dim, args.layers, args.family)
    label = args.method
    warm = args.device.startswith("cuda")  # one untimed run first: kernels, handles
    graph_dir = args.graph_rcmk if label in ("hopserve", "whole-graph-csr") else args.graph_orig
    if label == "hopserve-unordered":  # ablation: same engine, no RCMK reordering
        args.method = "hopserve"
    store = GraphStore.open(graph_dir)
    result: dict[str, Any] = {"method": label, "graph": Path(graph_dir).name}
    if args.method == "hopserve":
        ev = LayerwiseEvaluator(model, store, **harness.evaluator_options(args))
        base_rss = harness.current_rss_mb()  # libraries, model, evaluator: before graph data
        if warm:
            ev.evaluate()
            result["copy_bandwidth_bytes_s"] = cuda_copy_bandwidth(args.device)
            result["graph_resident"] = ev.graph_resident
        out, secs = harness.timed(ev.evaluate, 1)
        result["seconds"] = secs[0]
        s = ev.last_stats
        result["stages"] = harness.stage_seconds(
            s, ("prepare_s", "transfer_s", "compute_s", "write_out_s")
        )
        result["batches"] = s.batches
        result["input_nodes_per_batch"] = sum(x.input_nodes for x in s.layers) / max(1, s.batches)
        result["layers"] = [
            {"layer": x.layer, "batches": x.batches, "compute_s": x.compute_s,
             "gather_free": x.gather_free} for x in s.layers
        ]  # fmt: skip
        rows = np.arange(store.num_nodes)
    elif args.method in ("naive", "whole-graph", "whole-graph-csr"):
        model = model.to(args.device)

        def run():
            if args.method == "naive":
                return naive_layerwise(model, store, args.batch_size, args.device, args.family)
            return whole_graph(model, store, args.device, csr=args.method == "whole-graph-csr")

        base_rss = harness.current_rss_mb()
        try:
            if warm:
                run()
            out, secs = harness.timed(run, 1)
        except torch.OutOfMemoryError as err:
            result |= {"seconds": float("nan"), "error": f"out of memory: {str(err)[:120]}"}
            result["peak_rss_mb"] = harness.peak_rss_mb()
            result["baseline_rss_mb"] = base_rss
            harness.emit_result(result)
            return result
        result["seconds"] = secs[0]
        if store.node_ids is not None:  # the RCMK store: rows back in external-ID order
            out = out[store.sorted_external_order()]
        rows = np.arange(store.num_nodes)
    else:
        gen = np.random.default_rng(1)
        count = max(1, int(args.nodewise_fraction * store.num_nodes))
        rows = np.sort(gen.choice(store.num_nodes, size=count, replace=False))
        ev = NodewiseEvaluator(
            model, store, device=args.device, batch_size=args.nodewise_batch, degree_hop=False
        )
        base_rss = harness.current_rss_mb()
        out, secs = harness.timed(lambda: ev.evaluate(torch.from_numpy(rows)), 1)
        t = result["sampled_seconds"] = secs[0]
        result["alpha"] = count / store.num_nodes
        result["seconds"] = t / result["alpha"]
    result["peak_rss_mb"] = harness.peak_rss_mb()
    result["baseline_rss_mb"] = base_rss
    if args.device.startswith("cuda"):
        result["peak_device_mb"] = torch.cuda.max_memory_allocated(args.device) / 2**20
    np.save(Path(args.scratch) / f"{label}.npy", out.numpy())
    np.save(Path(args.scratch) / f"{label}_rows.npy", rows)
    harness.emit_result(result)
    return result


# --------------------------------------------------------------------------- driver
def parse_args() -> argparse.Namespace:
    p = harness.parser(__doc__)
    harness.add_graph_args(p, nodes=200_000, avg_degree=20.0, dim=128)
    harness.add_model_args(p, hidden=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--family", choices=FAMILIES, default="sage")
    harness.add_engine_args(p)
    p.add_argument("--batch-size", type=int, default=1024, help="naive loop's fixed batch")
    p.add_argument("--nodewise-fraction", type=float, default=0.002)
    p.add_argument("--nodewise-batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="runs of the fast methods (best kept)")
    harness.add_io_args(p)
    p.add_argument("--methods", default=",".join(METHODS))
    harness.add_child_args(p, "method", "graph_rcmk", "graph_orig", "scratch")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.family == "gat" and args.hidden % GAT_HEADS:
        raise SystemExit(f"--hidden {args.hidden}: GAT needs a multiple of {GAT_HEADS} (heads)")
    if args.method:
        run_method(args)
        return
    args.data = f"{args.data}-{args.nodes}-{args.avg_degree:g}-{args.dim}"
    graphs = harness.powerlaw_pair(
        Path(args.data), args.nodes, args.avg_degree, args.dim, seed=args.seed
    )
    scratch = Path(args.data) / "outputs"
    scratch.mkdir(parents=True, exist_ok=True)
    methods = args.methods.split(",")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    # Repeat the fast methods, interleaved, so a noisy neighbour hurts both alike;
    # node-wise is extrapolated from one long sampled run.
    for rep in range(args.repeat):
        for method in methods:
            if rep > 0 and (method == "nodewise" or "error" in runs[method][0]):
                continue  # extrapolated once; or it failed (e.g. out of memory) once
            harness.log(f"running {method} ({rep + 1}/{args.repeat}) …")
            runs[method].append(run_subprocess(args, graphs, scratch, method))
    results = {}
    for method, rs in runs.items():
        if "error" in rs[0]:
            results[method] = rs[0] | {"runs_seconds": []}
            continue
        best = min(rs, key=lambda r: r["seconds"])
        best.update(harness.run_stats([r["seconds"] for r in rs]))
        results[method] = best
    report(args, graphs, scratch, results)


def run_subprocess(
    args: argparse.Namespace, graphs: dict[str, str], scratch: Path, method: str
) -> dict[str, Any]:
    """Run one method in a fresh interpreter; return its RESULT record."""
    cmd = harness.script_command(
        __file__, args, CHILD_KEYS,
        "--method", method, "--graph-rcmk", graphs["rcmk"], "--graph-orig", graphs["orig"],
        "--scratch", str(scratch),
    )  # fmt: skip
    return harness.run_child(cmd, method)


def graph_bytes(path: str) -> int:
    """Bytes of a store's arrays on disk."""
    return sum(f.stat().st_size for f in Path(path).glob("*.npy"))


# --------------------------------------------------------------------------- report
def max_diff_vs_hopserve(scratch: Path, orig, method: str) -> float:
    """Max abs difference of ``method``'s saved rows to hopserve's, row for row by node
    id (``orig``: the store in generated numbering, which the methods' rows index)."""
    import numpy as np

    ref = np.load(scratch / "hopserve.npy")
    out = np.load(scratch / f"{method}.npy")
    rows = np.load(scratch / f"{method}_rows.npy")
    ids = orig.to_external(rows) if orig.node_ids is not None else rows
    return float(np.abs(out - ref[np.asarray(ids)]).max())


def report(
    args: argparse.Namespace, graphs: dict[str, str], scratch: Path, results: dict[str, Any]
) -> None:
    """Agreement with hopserve's rows, the memory model; ``full_eval.{json,md,png}``."""

    from hopserve import GraphStore

    store = GraphStore.open(graphs["rcmk"])
    orig = GraphStore.open(graphs["orig"])
    # Agreement: every method's rows against hopserve's (same node ids, exact methods).
    for method, res in results.items():
        if "error" not in res:
            res["max_abs_diff_vs_hopserve"] = max_diff_vs_hopserve(scratch, orig, method)
    emb_mb = store.num_nodes * args.hidden * 4 / 2**20
    model_mb = graph_bytes(graphs["rcmk"]) / 2**20 + 2 * emb_mb
    hop = results.get("hopserve", {})
    family = FAMILY_NAMES[args.family]
    summary = {
        "graph": {"nodes": store.num_nodes, "edges": store.num_edges, "feature_dim": args.dim},
        "model": f"{family} x{args.layers}, hidden {args.hidden}, out {args.out_dim}",
        "family": args.family,
        "device": args.device,
        "machine": harness.machine_line(),
        "results": results,
        "memory_model_mb": {
            "graph_and_features": graph_bytes(graphs["rcmk"]) / 2**20,
            "two_layers_of_embeddings": 2 * emb_mb,
            "total": model_mb,
        },
    }
    for other in ("naive", "nodewise", "whole-graph", "whole-graph-csr"):
        if other in results and hop and "error" not in results[other]:
            summary[f"speedup_vs_{other}"] = results[other]["seconds"] / hop["seconds"]
    if hop:
        summary["hopserve_rss_over_baseline_mb"] = hop["peak_rss_mb"] - hop["baseline_rss_mb"]
        summary["hopserve_rss_ratio_to_memory_model"] = (
            summary["hopserve_rss_over_baseline_mb"] / model_mb
        )
    roof = roofline(args, store, hop) if hop.get("copy_bandwidth_bytes_s") else None
    if roof:
        summary["roofline"] = roof
    lines = [
        f"Full evaluation — {summary['model']}; {store.num_nodes:,} nodes, "
        f"{store.num_edges:,} edges, {args.dim}-dim features; {args.device} "
        f"({summary['machine']}).",
        "",
    ]
    rows = []
    for method, res in results.items():
        if "error" in res:
            rows.append([method, res["error"][:60], "", "", "", "", ""])
            continue
        ratio = res["seconds"] / hop["seconds"] if hop else float("nan")
        note = f" (t/α, α={res['alpha']:.4f})" if "alpha" in res else ""
        rows.append(
            [
                f"{method}{note}",
                f"{res['seconds']:.3f}",
                ", ".join(f"{x:.3f}" for x in res["runs_seconds"]),
                f"{ratio:.2f}×",
                f"{res['peak_rss_mb']:.0f}",
                f"{res.get('peak_device_mb', res['peak_rss_mb'] - res['baseline_rss_mb']):.0f}",
                f"{res['max_abs_diff_vs_hopserve']:.1e}",
            ]
        )
    mem_head = "peak device MB" if args.device != "cpu" else "RSS over baseline (MB)"
    lines += harness.markdown_table(
        ["method", "best time (s)", "runs (s)", "time vs hopserve", "peak RSS (MB)",
         mem_head, "max abs diff vs hopserve"],
        rows,
        "lrlrrrr",
    )  # fmt: skip
    if hop:
        lines += [
            "",
            f"Memory model (graph + features + two layers of embeddings): {model_mb:.0f} MB; "
            f"hopserve's RSS over its baseline is "
            f"{summary['hopserve_rss_ratio_to_memory_model']:.2f}× of it.",
            f"hopserve stages (s): {hop['stages']}; {hop['batches']} batches, "
            f"{hop['input_nodes_per_batch']:.0f} input nodes per batch"
            + (f"; graph resident on the device: {hop['graph_resident']}." if roof else "."),
        ]
    if roof:
        lines += [
            "",
            f"Roofline: {roof['bytes'] / 1e9:.2f} GB of indices and rows read and rows written "
            f"over {roof['bandwidth_gb_s']:.0f} GB/s (measured device-to-device copy) = "
            f"{roof['seconds'] * 1e3:.1f} ms; hopserve reaches "
            f"{roof['fraction']:.1%} of it. Counting one aggregated row read per edge as well "
            f"(what an SpMM moves without cache reuse): {roof['edge_gather_bytes'] / 1e9:.1f} GB, "
            f"{roof['edge_gather_fraction']:.0%} of that roofline.",
        ]
    name = "full_eval" if (args.family, args.device) == ("sage", "cpu") else (
        f"full_eval_{args.family}_{args.device.split(':')[0]}"
    )  # fmt: skip
    harness.write_outputs(Path(args.out), name, summary, lines, lambda p: plot(summary, p))


def roofline(args: argparse.Namespace, store, hop: dict[str, Any]) -> dict[str, float]:
    """The fewest bytes a full evaluation moves through device memory, and the time
    they take at the measured copy bandwidth: per layer, the int64 CSC (indptr and
    indices) and every input row read once, every output row written once."""
    n, e = store.num_nodes, store.num_edges
    dims = [args.dim] + [args.hidden] * (args.layers - 1) + [args.out_dim]
    total = sum(8 * (n + 1) + 8 * e + 4 * n * (a + b) for a, b in zip(dims, dims[1:], strict=False))
    # An SpMM without cache reuse also reads one aggregated row per edge: hopserve's GCN
    # aggregates at the narrower of its two widths (projecting first or after), SAGE
    # before its projection (input width).
    pairs = list(zip(dims, dims[1:], strict=False))
    agg = [min(a, b) for a, b in pairs] if args.family == "gcn" else dims[:-1]
    gather = total + sum(4 * e * d for d in agg)
    bw = hop["copy_bandwidth_bytes_s"]
    return {
        "bytes": float(total),
        "bandwidth_gb_s": bw / 1e9,
        "seconds": total / bw,
        "fraction": total / bw / hop["seconds"],
        "edge_gather_bytes": float(gather),
        "edge_gather_fraction": gather / bw / hop["seconds"],
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    """Seconds per method, log scale."""
    plt = harness.pyplot()
    results = summary["results"]
    names = [m for m in results if "error" not in results[m]]
    secs = [results[m]["seconds"] for m in names]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    colors = {
        "hopserve": "#2b7bba",
        "hopserve-unordered": "#74a9cf",
        "naive": "#999999",
        "whole-graph": "#66a61e",
        "whole-graph-csr": "#1b9e77",
        "nodewise": "#d95f02",
    }
    bars = ax.barh(names, secs, color=[colors.get(n, "#666666") for n in names])
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale; node-wise extrapolated t/α)")
    ax.set_title(
        f"Full evaluation, {summary['model'].split(',')[0]}, "
        f"{summary['graph']['nodes']:,} nodes, {summary['device']}"
    )
    for bar, s in zip(bars, secs, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s:.3g}s", va="center")
    ax.invert_yaxis()
    harness.save_figure(fig, path)


if __name__ == "__main__":
    main()
