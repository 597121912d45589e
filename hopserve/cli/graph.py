"""``hopserve ingest`` and ``hopserve synth``: build graph-store directories.

Bad input exits with code 2 and one line ``error: <message>`` on stderr (no traceback).
torch/numpy are imported inside the command bodies so the CLI starts fast::

    hopserve ingest --edges edges.csv --features x.npy --out graphs/g1 --symmetrize
    hopserve ingest --from-dgl graph.bin --feature-key feat --out graphs/g2
    hopserve synth powerlaw --nodes 200000 --avg-degree 20 --dim 128 --out graphs/pl
    hopserve synth sbm --nodes 100000 --classes 8 --avg-degree 15 --dim 64 --out graphs/sbm
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hopserve.cli import app
from hopserve.cli.common import fail

if TYPE_CHECKING:
    from hopserve.worker.graph.build import BuildStats

synth_app = typer.Typer(
    help="Generate deterministic synthetic graphs (demo, tests, benchmarks).",
    no_args_is_help=True,
)
app.add_typer(synth_app, name="synth")


class Reorder(enum.StrEnum):
    """``--reorder`` choices."""

    rcmk = "rcmk"
    none = "none"


class EdgeData(enum.StrEnum):
    """``--edge-data`` choices: what the edge file's columns after src, dst hold."""

    weight = "weight"
    features = "features"


class FeatureDtype(enum.StrEnum):
    """``--dtype`` choices."""

    float32 = "float32"
    float16 = "float16"


_DELIMITERS: dict[str, str | None] = {
    "tab": "\t",
    "\\t": "\t",
    "\t": "\t",
    "comma": ",",
    ",": ",",
    "space": None,
    "whitespace": None,
}


def _run(fn: Callable[[], Any]) -> Any:
    """Run a build step, turning expected failures into ``error: ...`` and an exit code."""
    try:
        return fn()
    except (ValueError, FileExistsError) as e:  # IngestError, GraphFormatError are ValueErrors
        fail(str(e))
    except OSError as e:
        fail(str(e), code=1)


def _edge_summary(
    stats: BuildStats, *, symmetrize: bool, self_loops: bool, dedup: bool, stored: int
) -> str:
    """One line: edges read, what each requested transform changed, edges stored."""
    parts = [f"edges: {stats.input_edges:,} read"]
    if symmetrize:
        parts.append(f"symmetrize added {stats.reverse_edges_added:,} reverse edges")
    if self_loops:
        parts.append(f"self-loops added {stats.self_loops_added:,}")
    if dedup:
        parts.append(f"dedup removed {stats.duplicates_removed:,}")
    parts.append(f"{stored:,} stored")
    return "; ".join(parts)


def _parse_delimiter(delimiter: str | None) -> str | None:
    if delimiter is None:
        return None
    if delimiter.lower() in _DELIMITERS:
        return _DELIMITERS[delimiter.lower()]
    if len(delimiter) != 1:
        fail(f"unknown --delimiter {delimiter!r}: use ',', 'tab', 'space' or one character")
    return delimiter


Out = Annotated[Path, typer.Option("--out", "-o", help="Graph-store directory to create.")]
Force = Annotated[
    bool, typer.Option("--force", help="Replace an existing graph store (atomic swap).")
]
Symmetrize = Annotated[
    bool,
    typer.Option(
        "--symmetrize",
        help="Add each missing reverse edge (d, s); edges whose reverse exists are kept as is.",
    ),
]
SelfLoops = Annotated[
    bool, typer.Option("--self-loops", help="Add (v, v) for every node lacking one.")
]
Dedup = Annotated[bool, typer.Option("--dedup", help="Drop duplicate (src, dst) pairs.")]
ReorderOpt = Annotated[Reorder, typer.Option("--reorder", help="Node storage order.")]
Progress = Annotated[
    bool, typer.Option("--progress/--no-progress", help="Progress bars (TTY only).")
]
Dtype = Annotated[FeatureDtype, typer.Option("--dtype", help="Feature dtype.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (same seed, same graph).")]
Separation = Annotated[
    float, typer.Option("--separation", help="Distance between class centroids (noise std 1).")
]
Nodes = Annotated[int, typer.Option("--nodes", min=1, help="Number of nodes.")]
AvgDegree = Annotated[
    float, typer.Option("--avg-degree", min=0, help="Average in-degree E/N of the result.")
]
Dim = Annotated[int, typer.Option("--dim", min=0, help="Feature dimension.")]


@app.command("ingest")
def ingest_cmd(
    out: Out,
    edges: Annotated[
        Path | None,
        typer.Option(
            "--edges",
            help="Edge list: CSV/TSV/text (src dst [edge data columns]), .npy [E,2]/[2,E]/"
            "[E,2+k], .npz (src, dst, optional edge_weight [E], edge_features [E,d_e]) or "
            ".parquet (src, dst, then edge data columns).",
        ),
    ] = None,
    edge_data: Annotated[
        EdgeData,
        typer.Option(
            "--edge-data",
            help="What columns after src, dst hold: 'weight' = the 3rd is the edge weight, "
            "more are edge features (src,dst,weight,f1..fk); 'features' = all are edge "
            "features (src,dst,f1..fk). Stored in CSC order; a model's forward(x, "
            "edge_index, edge_weight / edge_attr) is served with them.",
        ),
    ] = EdgeData.weight,
    relation_column: Annotated[
        bool,
        typer.Option(
            "--relation-column",
            help="The 3rd column of a text/.npy edge file is the edge's integer relation "
            "id; edge data columns follow it (src,dst,relation[,weight,...]). .npz "
            "(edge_type / relation arrays) and .parquet (a relation / edge_type / etype "
            "column, ids or names) need no flag. A model's forward(x, edge_index, "
            "edge_type) (RGCNConv, RelGraphConv's etypes) is served with them.",
        ),
    ] = False,
    features: Annotated[
        Path | None, typer.Option("--features", help="Node features .npy [N, F].")
    ] = None,
    node_ids: Annotated[
        Path | None,
        typer.Option("--node-ids", help=".npy [N]: external ID of each feature row."),
    ] = None,
    labels: Annotated[
        Path | None, typer.Option("--labels", help=".npy [N] integer labels (-1 = none).")
    ] = None,
    symmetrize: Symmetrize = False,
    self_loops: SelfLoops = False,
    dedup: Dedup = False,
    reorder: ReorderOpt = Reorder.rcmk,
    delimiter: Annotated[
        str | None,
        typer.Option("--delimiter", help="',', 'tab' or 'space' (default: by extension)."),
    ] = None,
    skip_header: Annotated[
        bool, typer.Option("--skip-header", help="Skip the first line of a text edge file.")
    ] = False,
    force: Force = False,
    progress: Progress = True,
    from_dgl: Annotated[
        Path | None,
        typer.Option(
            "--from-dgl",
            help="A DGL graph file (dgl.save_graphs) instead of --edges/--features; needs DGL.",
        ),
    ] = None,
    feature_key: Annotated[
        str | None,
        typer.Option("--feature-key", help="--from-dgl: ndata key of the features (feat, x)."),
    ] = None,
    label_key: Annotated[
        str, typer.Option("--label-key", help="--from-dgl: ndata key of integer labels.")
    ] = "label",
    graph_index: Annotated[
        int, typer.Option("--graph-index", min=0, help="--from-dgl: which graph of the file.")
    ] = 0,
) -> None:
    """Ingest an edge list and node features (or a DGL graph file) into a graph-store directory.

    With --node-ids, edge endpoints are those external IDs; otherwise they are feature
    row numbers 0..N-1. With --from-dgl, node i of the DGL graph gets external ID i.
    """
    from hopserve.worker.graph.ingestion import ingest_with_stats

    if from_dgl is not None:
        extra = [
            flag
            for flag, value in (
                ("--edges", edges),
                ("--features", features),
                ("--node-ids", node_ids),
                ("--labels", labels),
                ("--delimiter", delimiter),
            )
            if value is not None
        ]
        if extra:
            fail(f"--from-dgl cannot be combined with {', '.join(extra)}")
        store = _ingest_dgl(
            from_dgl,
            out,
            feature_key=feature_key,
            label_key=label_key,
            graph_index=graph_index,
            symmetrize=symmetrize,
            add_self_loops=self_loops,
            dedup=dedup,
            reorder=reorder.value,
            overwrite=force,
            progress=progress,
        )
        typer.echo(f"wrote {out}: {store!r}")
        return
    missing = [f for f, v in (("--edges", edges), ("--features", features)) if v is None]
    if missing:
        fail(f"missing {' and '.join(missing)} (or give a DGL graph file with --from-dgl)")
    delim = _parse_delimiter(delimiter)
    result = _run(
        lambda: ingest_with_stats(
            edges,
            features,
            out=out,
            node_ids=node_ids,
            labels=labels,
            symmetrize=symmetrize,
            add_self_loops=self_loops,
            dedup=dedup,
            reorder=reorder.value,
            delimiter=delim,
            skip_header=skip_header,
            overwrite=force,
            progress=progress,
            edge_data=edge_data.value,
            relation_column=relation_column,
        )
    )
    typer.echo(f"wrote {out}: {result.store!r}")
    typer.echo(
        _edge_summary(
            result.stats,
            symmetrize=symmetrize,
            self_loops=self_loops,
            dedup=dedup,
            stored=result.store.num_edges,
        )
    )


def _ingest_dgl(
    path: Path,
    out: Path,
    *,
    feature_key: str | None,
    label_key: str,
    graph_index: int,
    reorder: str,
    overwrite: bool,
    progress: bool,
    **kw: bool,
):
    """Load graph ``graph_index`` of a ``dgl.save_graphs`` file and write it as a store."""
    try:
        import dgl
    except Exception as err:  # not installed, or a build that does not load with this torch
        fail(
            f"--from-dgl needs DGL ({type(err).__name__}: {err}); install a DGL build that "
            "matches your torch (hopserve[dgl], see README) or use `make dgl-env`"
        )
    from hopserve.worker.graph.store import GraphStore

    if not path.is_file():
        fail(f"{path}: no such file")
    try:
        graphs, _ = dgl.load_graphs(str(path))
    except Exception as err:
        fail(f"{path}: cannot be read by dgl.load_graphs: {err}")
    if graph_index >= len(graphs):
        fail(f"{path} holds {len(graphs)} graph(s); --graph-index {graph_index} is out of range")

    def build() -> GraphStore:
        store = GraphStore.from_dgl(
            graphs[graph_index],
            feature_key=feature_key,
            label_key=label_key,
            reorder=None if reorder == "none" else reorder,
            progress=progress,
            **kw,
        )
        store.save(out, overwrite=overwrite, progress=progress)
        return GraphStore.open(out)

    return _run(build)


@synth_app.command("powerlaw")
def synth_powerlaw_cmd(
    nodes: Nodes,
    avg_degree: AvgDegree,
    dim: Dim,
    out: Out,
    classes: Annotated[
        int, typer.Option("--classes", min=0, help="Random labels + class-centroid features.")
    ] = 0,
    seed: Seed = 0,
    separation: Separation = 2.0,
    symmetrize: Symmetrize = False,
    self_loops: SelfLoops = False,
    dedup: Dedup = False,
    reorder: ReorderOpt = Reorder.rcmk,
    dtype: Dtype = FeatureDtype.float32,
    force: Force = False,
    progress: Progress = True,
) -> None:
    """R-MAT power-law graph (directed unless --symmetrize)."""
    from hopserve.worker.graph.synth import synth_powerlaw

    store = _run(
        lambda: synth_powerlaw(
            nodes,
            avg_degree,
            dim,
            seed=seed,
            num_classes=classes,
            separation=separation,
            symmetrize=symmetrize,
            add_self_loops=self_loops,
            dedup=dedup,
            reorder=reorder.value,
            feature_dtype=dtype.value,
            out=out,
            overwrite=force,
            progress=progress,
        )
    )
    typer.echo(f"wrote {out}: {store!r}")


@synth_app.command("sbm")
def synth_sbm_cmd(
    nodes: Nodes,
    classes: Annotated[int, typer.Option("--classes", min=1, help="Blocks (= label classes).")],
    avg_degree: AvgDegree,
    dim: Dim,
    out: Out,
    intra_fraction: Annotated[
        float,
        typer.Option("--intra-fraction", min=0, max=1, help="Expected share of intra-block edges."),
    ] = 0.8,
    seed: Seed = 0,
    separation: Separation = 2.0,
    symmetrize: Symmetrize = False,
    self_loops: SelfLoops = False,
    dedup: Dedup = False,
    reorder: ReorderOpt = Reorder.rcmk,
    dtype: Dtype = FeatureDtype.float32,
    force: Force = False,
    progress: Progress = True,
) -> None:
    """Stochastic block model with informative features (labels = blocks)."""
    from hopserve.worker.graph.synth import synth_sbm

    store = _run(
        lambda: synth_sbm(
            nodes,
            classes,
            avg_degree,
            dim,
            intra_fraction=intra_fraction,
            separation=separation,
            seed=seed,
            symmetrize=symmetrize,
            add_self_loops=self_loops,
            dedup=dedup,
            reorder=reorder.value,
            feature_dtype=dtype.value,
            out=out,
            overwrite=force,
            progress=progress,
        )
    )
    typer.echo(f"wrote {out}: {store!r}")


@synth_app.command("recommender")
def synth_recommender_cmd(
    out: Out,
    users: Annotated[int, typer.Option("--users", min=1, help="User nodes.")] = 600_000,
    items: Annotated[int, typer.Option("--items", min=1, help="Item nodes.")] = 380_000,
    categories: Annotated[int, typer.Option("--categories", min=1, help="Category nodes.")] = 2_000,
    dim: Annotated[int, typer.Option("--dim", min=1, help="Feature width (all types).")] = 64,
    avg_clicks: Annotated[
        float, typer.Option("--avg-clicks", min=0, help="Clicks per user (Poisson mean).")
    ] = 7.0,
    seed: Seed = 0,
    separation: Separation = 2.0,
    reorder: ReorderOpt = Reorder.rcmk,
    force: Force = False,
    progress: Progress = True,
) -> None:
    """Typed recommender graph: users, items, categories; clicks, buys, belongs-to and
    reverses (labels: a user's preferred category, an item's category)."""
    from hopserve.worker.graph.synth_hetero import synth_recommender

    store = _run(
        lambda: synth_recommender(
            users, items, categories, dim, avg_clicks=avg_clicks, separation=separation,
            seed=seed, reorder=reorder.value, out=out, overwrite=force, progress=progress,
        )
    )  # fmt: skip
    typer.echo(f"wrote {out}: {store!r}")


@synth_app.command("fraud")
def synth_fraud_cmd(
    out: Out,
    accounts: Annotated[int, typer.Option("--accounts", min=1)] = 200_000,
    devices: Annotated[int, typer.Option("--devices", min=1)] = 150_000,
    merchants: Annotated[int, typer.Option("--merchants", min=1)] = 20_000,
    transactions: Annotated[int, typer.Option("--transactions", min=1)] = 600_000,
    dim: Annotated[int, typer.Option("--dim", min=1, help="Feature width (all types).")] = 32,
    ring_fraction: Annotated[
        float, typer.Option("--ring-fraction", min=0, max=0.99, help="Accounts in fraud rings.")
    ] = 0.02,
    seed: Seed = 0,
    separation: Separation = 2.0,
    reorder: ReorderOpt = Reorder.rcmk,
    force: Force = False,
    progress: Progress = True,
) -> None:
    """Typed fraud graph: accounts, devices, merchants, transactions (labels: ring
    membership, fraudulent transactions)."""
    from hopserve.worker.graph.synth_hetero import synth_fraud

    store = _run(
        lambda: synth_fraud(
            accounts, devices, merchants, transactions, dim, ring_fraction=ring_fraction,
            separation=separation, seed=seed, reorder=reorder.value, out=out, overwrite=force,
            progress=progress,
        )
    )  # fmt: skip
    typer.echo(f"wrote {out}: {store!r}")


def _pairs(values: list[str], what: str, arity: int) -> dict:
    """``KEY=PATH`` options -> ``{key: path}`` (``KEY`` split on ``:`` when ``arity > 1``)."""
    out: dict = {}
    for value in values:
        key, sep, path = value.partition("=")
        parts = key.split(":")
        if not sep or not path or len(parts) != arity or not all(parts):
            want = "TYPE=PATH" if arity == 1 else "SRC:RELATION:DST=PATH"
            fail(f"{what} {value!r}: expected {want}")
        out[parts[0] if arity == 1 else tuple(parts)] = Path(path)
    return out


@app.command("ingest-typed")
def ingest_typed_cmd(
    out: Out,
    nodes: Annotated[
        list[str],
        typer.Option("--nodes", help="TYPE=features.npy [N_t, F_t], one per node type (repeat)."),
    ],
    edges: Annotated[
        list[str],
        typer.Option(
            "--edges",
            help="SRC:RELATION:DST=edge file, one per relation (repeat); endpoints are the "
            "types' node IDs (--node-ids, else row indices 0..N_t-1); any format and edge "
            "data columns of `ingest`.",
        ),
    ],
    labels: Annotated[
        list[str] | None, typer.Option("--labels", help="TYPE=labels.npy [N_t] (repeat).")
    ] = None,
    node_ids: Annotated[
        list[str] | None,
        typer.Option(
            "--node-ids",
            help="TYPE=ids.npy [N_t]: the type's own node IDs, distinct within it (repeat); "
            "typed requests name its nodes by them.",
        ),
    ] = None,
    edge_data: Annotated[
        EdgeData, typer.Option("--edge-data", help="As for `ingest`.")
    ] = EdgeData.weight,
    delimiter: Annotated[
        str | None, typer.Option("--delimiter", help="Text edge files: ',', 'tab', 'space'.")
    ] = None,
    skip_header: Annotated[bool, typer.Option("--skip-header", help="Text: skip line 1.")] = False,
    reorder: ReorderOpt = Reorder.rcmk,
    force: Force = False,
    progress: Progress = True,
) -> None:
    """Build a typed graph store (node types, relations) from per-type node files and
    per-relation edge files."""
    from hopserve.worker.graph.ingest_typed import ingest_typed

    node_files = _pairs(nodes, "--nodes", 1)
    edge_files = _pairs(edges, "--edges", 3)
    label_files = _pairs(labels or [], "--labels", 1)
    id_files = _pairs(node_ids or [], "--node-ids", 1)
    delim = _parse_delimiter(delimiter)
    store = _run(
        lambda: ingest_typed(
            node_files, edge_files, out=out, labels=label_files or None,
            node_ids=id_files or None, reorder=reorder.value,
            delimiter=delim, skip_header=skip_header, edge_data=edge_data.value, overwrite=force,
            progress=progress,
        )
    )  # fmt: skip
    typer.echo(f"wrote {out}: {store!r}")
