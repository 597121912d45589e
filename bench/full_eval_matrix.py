"""Full evaluation per family and depth: hopserve against the model's own whole-graph forward.

One graph (``full_eval.py``'s synthetic power-law graph), and for each family (GraphSAGE-mean,
GCN, GAT) and depth (1–3 layers) the same seeded PyG model evaluated by

* ``hopserve`` — LayerwiseEvaluator on the RCMK-ordered store;
* the fastest whole-graph forward PyG offers for it: ``forward(x, adj_t)`` with the
  transposed adjacency as torch sparse CSR (the fused SpMM) for SAGE and GCN; for GAT,
  ``forward(x, edge_index)`` (its self-loop handling needs an ``edge_index``).

Each (cell, method) runs in its own interpreter (``full_eval.py``'s child runs, so peak RSS
is its own); the two methods of a cell alternate ``--repeat`` times and the best is kept.
The ratio is whole-graph seconds / hopserve seconds (the goal: ≥ 1.0× on every row), with
hopserve's peak RSS over its baseline against the memory model (graph + features + two
layers of ``hidden``-wide embeddings; the goal: ≤ 1.3×). Outputs
``bench/results/full_eval_matrix.{json,md,png}``. Ratios are measured side by side in one
run; absolute times only mean something on the machine that produced them.

    python bench/full_eval_matrix.py                      # 200K nodes / 4M edges, CPU
    python bench/full_eval_matrix.py --families gat --merge   # re-run GAT, keep the rest
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import full_eval
import harness

WHOLE_GRAPH = {"sage": "whole-graph-csr", "gcn": "whole-graph-csr", "gat": "whole-graph"}
# PyG's CSR GCN forward normalizes a graph's own self-loops and duplicate edges otherwise
# than its edge_index forward, the reference hopserve matches: run that once for the diff.
REFERENCE = {"sage": "whole-graph-csr", "gcn": "whole-graph", "gat": "whole-graph"}


def parse_args() -> argparse.Namespace:
    p = harness.parser(__doc__)
    harness.add_graph_args(p, nodes=200_000, avg_degree=20.0, dim=128)
    harness.add_model_args(p, hidden=256)
    p.add_argument("--families", default=",".join(full_eval.FAMILIES))
    p.add_argument("--depths", default="1,2,3")
    harness.add_engine_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="runs per method and cell (best kept)")
    harness.add_io_args(p)
    p.add_argument(
        "--merge", action="store_true", help="keep the committed rows of cells not run now"
    )
    args = p.parse_args()
    # full_eval's child options this driver does not vary
    args.batch_size, args.nodewise_fraction, args.nodewise_batch = 1024, 0.002, 64
    return args


def run_cell(args, graphs, scratch: Path, family: str, layers: int, orig) -> dict[str, Any]:
    """Both methods of one cell, interleaved; the best of each, their agreement."""
    cell = copy.copy(args)
    cell.family, cell.layers = family, layers
    methods = ("hopserve", WHOLE_GRAPH[family])
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for rep in range(args.repeat):
        for method in methods:
            if rep > 0 and "error" in runs[method][0]:
                continue
            harness.log(f"{family} x{layers}: {method} ({rep + 1}/{args.repeat}) …")
            runs[method].append(full_eval.run_subprocess(cell, graphs, scratch, method))
    row: dict[str, Any] = {"family": family, "layers": layers}
    for method, rs in runs.items():
        if "error" in rs[0]:
            row[method] = rs[0]
            continue
        best = min(rs, key=lambda r: r["seconds"])
        row[method] = best | harness.run_stats([r["seconds"] for r in rs])
    whole = row[WHOLE_GRAPH[family]]
    if "error" not in whole and "error" not in row["hopserve"]:
        row["whole_graph_over_hopserve"] = whole["seconds"] / row["hopserve"]["seconds"]
    reference = REFERENCE[family]
    if reference not in row:
        harness.log(f"{family} x{layers}: {reference} (exactness reference) …")
        row[reference] = full_eval.run_subprocess(cell, graphs, scratch, reference)
    if "error" not in row[reference]:
        row["reference"] = reference
        row["max_abs_diff"] = full_eval.max_diff_vs_hopserve(scratch, orig, reference)
    return row


def main() -> None:
    from hopserve import GraphStore

    args = parse_args()
    if "gat" in args.families.split(",") and args.hidden % full_eval.GAT_HEADS:
        raise SystemExit(f"--hidden {args.hidden}: GAT needs a multiple of {full_eval.GAT_HEADS}")
    args.data = f"{args.data}-{args.nodes}-{args.avg_degree:g}-{args.dim}"
    graphs = harness.powerlaw_pair(
        Path(args.data), args.nodes, args.avg_degree, args.dim, seed=args.seed
    )
    scratch = Path(args.data) / "outputs"
    scratch.mkdir(parents=True, exist_ok=True)
    orig = GraphStore.open(graphs["orig"])
    rows = [
        run_cell(args, graphs, scratch, family, int(layers), orig)
        for family in args.families.split(",")
        for layers in args.depths.split(",")
    ]
    if args.merge:
        rows = merged(Path(args.out) / "full_eval_matrix.json", rows)
    report(args, graphs, rows)


def merged(path: Path, rows: list[dict]) -> list[dict]:
    """The rows of an earlier run's ``path`` with this run's cells replaced (each row
    keeps its own run's ratio; a merged row says so)."""
    import json

    ran = {(r["family"], r["layers"]) for r in rows}
    kept = [
        r | {"merged_from_earlier_run": True}
        for r in json.loads(path.read_text())["rows"]
        if (r["family"], r["layers"]) not in ran
    ]
    order = {f: i for i, f in enumerate(full_eval.FAMILIES)}
    return sorted([*kept, *rows], key=lambda r: (order[r["family"]], r["layers"]))


def report(args: argparse.Namespace, graphs: dict[str, str], rows: list[dict]) -> None:
    from hopserve import GraphStore

    store = GraphStore.open(graphs["rcmk"])
    graph_mb = full_eval.graph_bytes(graphs["rcmk"]) / 2**20
    emb_mb = 2 * store.num_nodes * args.hidden * 4 / 2**20
    model_mb = graph_mb + emb_mb
    table = []
    for row in rows:
        hop, whole = row["hopserve"], row[WHOLE_GRAPH[row["family"]]]
        hop_mb = hop["peak_rss_mb"] - hop["baseline_rss_mb"]
        row["hopserve_rss_ratio_to_memory_model"] = hop_mb / model_mb
        whole_mb = whole["peak_rss_mb"] - whole["baseline_rss_mb"]
        whole_s = whole.get("error", "")[:40] or f"{whole['seconds']:.3f}"
        ratio = row.get("whole_graph_over_hopserve")
        mark = " (earlier run)" if row.get("merged_from_earlier_run") else ""
        table.append(
            [
                full_eval.FAMILY_NAMES[row["family"]] + mark,
                row["layers"],
                f"{hop['seconds']:.3f}",
                WHOLE_GRAPH[row["family"]],
                whole_s,
                "—" if ratio is None else f"{ratio:.2f}×",
                f"{hop_mb:.0f} ({hop_mb / model_mb:.2f}×) / {whole_mb:.0f} "
                f"({whole_mb / model_mb:.2f}×)",
                "—" if "max_abs_diff" not in row else f"{row['max_abs_diff']:.1e}",
            ]
        )
    summary = {
        "graph": {"nodes": store.num_nodes, "edges": store.num_edges, "feature_dim": args.dim},
        "model": f"hidden {args.hidden}, out {args.out_dim}; GAT {full_eval.GAT_HEADS} heads",
        "device": args.device,
        "threads": args.threads,
        "machine": harness.machine_line(),
        "memory_model_mb": {"graph_and_features": graph_mb, "two_layers_of_embeddings": emb_mb},
        "rows": rows,
    }
    lines = [
        f"Full evaluation per family and depth — hopserve vs the model's own whole-graph "
        f"forward (PyG). {store.num_nodes:,} nodes, {store.num_edges:,} edges (synthetic "
        f"power-law), {args.dim}-dim features; {summary['model']}; {args.device}, "
        f"{args.threads} threads ({summary['machine']}).",
        "",
        *harness.markdown_table(
            [
                "model",
                "L",
                "hopserve (s)",
                "whole-graph forward",
                "whole-graph (s)",
                "vs whole-graph",
                "RSS over baseline, MB (× model): hopserve / whole-graph",
                "max abs diff",
            ],
            table,
            "lrrlrrlr",
        ),  # fmt: skip
        "",
        f"Best of {args.repeat} runs each, the two methods alternating, each run in its own "
        "interpreter. vs whole-graph = whole-graph seconds / hopserve seconds (≥ 1.0× is the "
        f"goal). Memory model: graph + features {graph_mb:.0f} MB + two layers of "
        f"{args.hidden}-wide embeddings {emb_mb:.0f} MB = {model_mb:.0f} MB (the goal: "
        "hopserve ≤ 1.3×). Max abs diff: hopserve's rows against the model's `edge_index` "
        "forward for GCN and GAT (PyG's CSR GCN forward normalizes the graph's own self-loops "
        "and duplicate edges otherwise), against the CSR forward for SAGE.",
    ]
    harness.write_outputs(
        Path(args.out), "full_eval_matrix", summary, lines, lambda p: plot(rows, p)
    )


def plot(rows: list[dict], path: Path) -> None:
    """Whole-graph seconds / hopserve seconds per family and depth, with the 1.0× line."""
    plt = harness.pyplot()
    families = list(dict.fromkeys(r["family"] for r in rows))
    depths = sorted({r["layers"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.8 / max(1, len(depths))
    for j, layers in enumerate(depths):
        xs, ys = [], []
        for i, family in enumerate(families):
            for r in rows:
                if (r["family"], r["layers"]) == (
                    family,
                    layers,
                ) and "whole_graph_over_hopserve" in r:
                    xs.append(i + (j - (len(depths) - 1) / 2) * width)
                    ys.append(r["whole_graph_over_hopserve"])
        bars = ax.bar(xs, ys, width, label=f"{layers} layer{'s' if layers > 1 else ''}")
        for bar, y in zip(bars, ys, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, y, f"{y:.2f}", ha="center", va="bottom",
                    fontsize=7)  # fmt: skip
    ax.axhline(1.0, color="#444444", lw=0.8, ls="--")
    ax.set_xticks(range(len(families)), [full_eval.FAMILY_NAMES[f] for f in families])
    ax.set_ylabel("whole-graph s / hopserve s")
    ax.set_title(
        "Full evaluation vs the whole-graph forward (higher: hopserve faster)", fontsize=10
    )
    ax.legend(fontsize=8)
    harness.save_figure(fig, path)


if __name__ == "__main__":
    main()
