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

Outputs ``bench/results/full_eval.{json,md,png}``. Ratios are measured side by side in one
run; absolute times are only meaningful on the machine that produced them.

    python bench/full_eval.py                       # default: 200K nodes / 4M edges, CPU
    python bench/full_eval.py --nodes 2400000 --avg-degree 25 --device cuda
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import harness

METHODS = ("hopserve", "hopserve-unordered", "naive", "nodewise")
# Options the parent passes on to each method's child run.
CHILD_KEYS = (
    "nodes", "dim", "hidden", "out_dim", "layers", "device", "threads", "batch_size",
    "budget_mb", "nodewise_fraction", "nodewise_batch",
)  # fmt: skip


# --------------------------------------------------------------------------- model
def make_model(d_in: int, hidden: int, d_out: int, layers: int):
    """The benchmark's model: GraphSAGE (mean) with ReLU between layers, seeded."""
    import torch
    from torch import nn
    from torch_geometric.nn import SAGEConv

    class GraphSAGE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dims = [d_in] + [hidden] * (layers - 1) + [d_out]
            self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:], strict=False))

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    torch.manual_seed(0)
    return GraphSAGE().eval()


def naive_layerwise(model, store, batch_size: int, device: str):
    """DGL-manual: per layer, fixed-size batches of consecutive node ids, no reordering."""
    import torch

    n = store.num_nodes
    indptr, indices = store.indptr, store.indices
    deg = indptr[1:] - indptr[:-1]
    h = store.features
    for i, conv in enumerate(model.convs):
        out = None
        for start in range(0, n, batch_size):
            end = min(n, start + batch_size)
            a, b = int(indptr[start]), int(indptr[end])
            src = indices[a:b].long()
            dst_local = torch.repeat_interleave(torch.arange(end - start), deg[start:end])
            nodes, inverse = torch.unique(src, return_inverse=True)
            x_src = h[nodes].float().to(device)
            x_dst = h[start:end].float().to(device)
            edge_index = torch.stack([inverse, dst_local]).to(device)
            with torch.no_grad():
                y = conv((x_src, x_dst), edge_index)
                if i < len(model.convs) - 1:
                    y = y.relu()
            if out is None:
                out = torch.empty(n, y.shape[1])
            out[start:end] = y.cpu()
        h = out
    return h


# --------------------------------------------------------------------------- one method
def run_method(args: argparse.Namespace) -> dict[str, Any]:
    """Run one method in this process; print a JSON line with its measurements."""
    import numpy as np
    import torch

    from hopserve import GraphStore, LayerwiseEvaluator, NodewiseEvaluator

    torch.set_num_threads(args.threads)
    model = make_model(args.dim, args.hidden, args.out_dim, args.layers)
    label = args.method
    graph_dir = args.graph_rcmk if label == "hopserve" else args.graph_orig
    if label == "hopserve-unordered":  # ablation: same engine, no RCMK reordering
        args.method = "hopserve"
    store = GraphStore.open(graph_dir)
    result: dict[str, Any] = {"method": label, "graph": Path(graph_dir).name}
    if args.method == "hopserve":
        ev = LayerwiseEvaluator(model, store, **harness.evaluator_options(args))
        base_rss = harness.current_rss_mb()  # libraries, model, evaluator: before graph data
        out, secs = harness.timed(ev.evaluate, 1)
        result["seconds"] = secs[0]
        s = ev.last_stats
        result["stages"] = harness.stage_seconds(
            s, ("prepare_s", "transfer_s", "compute_s", "write_out_s")
        )
        result["batches"] = s.batches
        result["input_nodes_per_batch"] = sum(x.input_nodes for x in s.layers) / max(1, s.batches)
        rows = np.arange(store.num_nodes)
    elif args.method == "naive":
        base_rss = harness.current_rss_mb()
        out, secs = harness.timed(
            lambda: naive_layerwise(model, store, args.batch_size, args.device), 1
        )
        result["seconds"] = secs[0]
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
            if method == "nodewise" and rep > 0:
                continue
            harness.log(f"running {method} ({rep + 1}/{args.repeat}) …")
            runs[method].append(run_subprocess(args, graphs, scratch, method))
    results = {}
    for method, rs in runs.items():
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
def report(
    args: argparse.Namespace, graphs: dict[str, str], scratch: Path, results: dict[str, Any]
) -> None:
    """Agreement with hopserve's rows, the memory model; ``full_eval.{json,md,png}``."""
    import numpy as np

    from hopserve import GraphStore

    store = GraphStore.open(graphs["rcmk"])
    orig = GraphStore.open(graphs["orig"])
    # Agreement: every method's rows against hopserve's (same node ids, exact methods).
    ref = np.load(scratch / "hopserve.npy")
    for method, res in results.items():
        out = np.load(scratch / f"{method}.npy")
        rows = np.load(scratch / f"{method}_rows.npy")
        ids = orig.to_external(rows) if orig.node_ids is not None else rows
        res["max_abs_diff_vs_hopserve"] = float(np.abs(out - ref[np.asarray(ids)]).max())
    emb_mb = store.num_nodes * args.hidden * 4 / 2**20
    model_mb = graph_bytes(graphs["rcmk"]) / 2**20 + 2 * emb_mb
    hop = results.get("hopserve", {})
    summary = {
        "graph": {"nodes": store.num_nodes, "edges": store.num_edges, "feature_dim": args.dim},
        "model": f"GraphSAGE-mean x{args.layers}, hidden {args.hidden}, out {args.out_dim}",
        "device": args.device,
        "machine": harness.machine_line(),
        "results": results,
        "memory_model_mb": {
            "graph_and_features": graph_bytes(graphs["rcmk"]) / 2**20,
            "two_layers_of_embeddings": 2 * emb_mb,
            "total": model_mb,
        },
    }
    for other in ("naive", "nodewise"):
        if other in results and hop:
            summary[f"speedup_vs_{other}"] = results[other]["seconds"] / hop["seconds"]
    if hop:
        summary["hopserve_rss_over_baseline_mb"] = hop["peak_rss_mb"] - hop["baseline_rss_mb"]
        summary["hopserve_rss_ratio_to_memory_model"] = (
            summary["hopserve_rss_over_baseline_mb"] / model_mb
        )
    lines = [
        f"Full evaluation — {summary['model']}; {store.num_nodes:,} nodes, "
        f"{store.num_edges:,} edges, {args.dim}-dim features; {args.device} "
        f"({summary['machine']}).",
        "",
    ]
    rows = []
    for method, res in results.items():
        ratio = res["seconds"] / hop["seconds"] if hop else float("nan")
        note = f" (t/α, α={res['alpha']:.4f})" if "alpha" in res else ""
        rows.append(
            [
                f"{method}{note}",
                f"{res['seconds']:.2f}",
                ", ".join(f"{x:.2f}" for x in res["runs_seconds"]),
                f"{ratio:.1f}×",
                f"{res['peak_rss_mb']:.0f}",
                f"{res['peak_rss_mb'] - res['baseline_rss_mb']:.0f}",
                f"{res['max_abs_diff_vs_hopserve']:.1e}",
            ]
        )
    lines += harness.markdown_table(
        ["method", "best time (s)", "runs (s)", "vs hopserve", "peak RSS (MB)",
         "RSS over baseline (MB)", "max abs diff vs hopserve"],
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
            f"{hop['input_nodes_per_batch']:.0f} input nodes per batch.",
        ]
    harness.write_outputs(Path(args.out), "full_eval", summary, lines, lambda p: plot(summary, p))


def plot(summary: dict[str, Any], path: Path) -> None:
    """Seconds per method, log scale."""
    plt = harness.pyplot()
    results = summary["results"]
    names = list(results)
    secs = [results[m]["seconds"] for m in names]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    colors = {
        "hopserve": "#2b7bba",
        "hopserve-unordered": "#74a9cf",
        "naive": "#999999",
        "nodewise": "#d95f02",
    }
    bars = ax.barh(names, secs, color=[colors.get(n, "#666666") for n in names])
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale; node-wise extrapolated t/α)")
    ax.set_title(f"Full evaluation, {summary['graph']['nodes']:,} nodes, {summary['device']}")
    for bar, s in zip(bars, secs, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s:.1f}s", va="center")
    ax.invert_yaxis()
    harness.save_figure(fig, path)


if __name__ == "__main__":
    main()
