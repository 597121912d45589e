"""``hopserve query``: fetch node embeddings from a running server.

Uses the client SDK only (grpcio, protobuf, numpy), so it works without torch::

    hopserve query --target localhost:50051 --model sage --nodes 1,2,3
    hopserve query -t localhost:50051 -m sage --nodes-file ids.npy --fanouts 10,10 -f table
    HOPSERVE_TOKEN=... hopserve query -t hopserve:50051 --root-certs ca.crt -m sage -n 1,2
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from hopserve.cli import app
from hopserve.cli.connect import (
    ClientCert,
    ClientKey,
    RootCerts,
    Tls,
    Token,
    TokenFile,
    client_options,
)
from hopserve.client import EmbeddingClient, EmbeddingResult, HopserveError


class CacheMode(enum.StrEnum):
    """``--cache`` choices (``hopserve.v1.CachePolicy``)."""

    use = "use"
    refresh = "refresh"
    bypass = "bypass"


class OutputFormat(enum.StrEnum):
    """``--format`` choices."""

    json = "json"
    table = "table"


def parse_int_list(text: str, what: str) -> list[int]:
    """Parse integers separated by commas and/or whitespace; '#' starts a comment line.

    Raises:
        typer.BadParameter: A token is not an integer, or there are none.
    """
    tokens = [
        tok
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for tok in line.replace(",", " ").split()
    ]
    try:
        values = [int(tok) for tok in tokens]
    except ValueError as exc:
        raise typer.BadParameter(f"{what}: not an integer list ({exc})") from None
    if not values:
        raise typer.BadParameter(f"{what}: no values given")
    return values


def load_node_ids(nodes: str | None, nodes_file: Path | None) -> np.ndarray:
    """Node IDs from ``--nodes`` or ``--nodes-file`` (exactly one of them).

    A ``.npy`` file holds a 1-D integer array; any other file is text read by
    :func:`parse_int_list`.
    """
    if (nodes is None) == (nodes_file is None):
        raise typer.BadParameter("give exactly one of --nodes and --nodes-file")
    if nodes is not None:
        return np.asarray(parse_int_list(nodes, "--nodes"), dtype=np.int64)
    assert nodes_file is not None
    if nodes_file.suffix == ".npy":
        ids = np.load(nodes_file, allow_pickle=False)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise typer.BadParameter(
                f"--nodes-file {nodes_file}: expected a 1-D integer array, "
                f"got shape {ids.shape} dtype {ids.dtype}"
            )
        return ids.astype(np.int64)
    text = nodes_file.read_text()
    return np.asarray(parse_int_list(text, f"--nodes-file {nodes_file}"), dtype=np.int64)


def render_json(ids: np.ndarray, result: EmbeddingResult) -> str:
    """The result as one JSON object (embeddings as nested lists, float32 values exact)."""
    return json.dumps(
        {
            "model": result.model,
            "model_version": result.model_version,
            "graph_version": result.graph_version,
            "num_nodes": int(result.embeddings.shape[0]),
            "dim": int(result.embeddings.shape[1]),
            "cache_hits": result.cache_hits,
            "timing": result.timing,
            "layer_compute": list(result.layer_compute),
            "node_ids": ids.tolist(),
            "embeddings": result.embeddings.tolist(),
        }
    )


def render_table(ids: np.ndarray, result: EmbeddingResult, max_cols: int, precision: int) -> str:
    """The result as an aligned text table of the first ``max_cols`` columns (0 = all)."""
    emb = result.embeddings
    dim = emb.shape[1]
    cols = dim if max_cols <= 0 else min(max_cols, dim)
    cells = [["node_id", *(f"e{j}" for j in range(cols))]]
    cells += [
        [str(i), *(f"{v:.{precision}g}" for v in row[:cols])]
        for i, row in zip(ids, emb, strict=True)
    ]
    widths = [max(len(row[j]) for row in cells) for j in range(cols + 1)]
    more = f"  ... {dim - cols} more columns" if cols < dim else ""
    lines = [
        f"# model={result.model} version={result.model_version} graph={result.graph_version} "
        f"dim={dim} rows={emb.shape[0]} cache_hits={result.cache_hits} "
        f"server_total={result.timing.get('total', 0.0):.4f}s{more}"
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


@app.command()
def query(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name.")],
    target: Annotated[
        str, typer.Option("--target", "-t", help="Server address, HOST:PORT.")
    ] = "localhost:50051",
    nodes: Annotated[
        str | None, typer.Option("--nodes", "-n", help="External node IDs: 1,2,3.")
    ] = None,
    nodes_file: Annotated[
        Path | None,
        typer.Option(
            "--nodes-file",
            exists=True,
            dir_okay=False,
            help="Node IDs from a file: .npy (1-D ints) or text (commas/whitespace).",
        ),
    ] = None,
    fanouts: Annotated[
        str | None,
        typer.Option("--fanouts", help="Per-layer sampling fanouts, e.g. 10,10 (-1 = all)."),
    ] = None,
    cache: Annotated[CacheMode, typer.Option("--cache", help="Cache policy.")] = CacheMode.use,
    model_version: Annotated[
        str | None, typer.Option("--model-version", help="Model version (default: latest).")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Sampling seed.")] = None,
    node_type: Annotated[
        str | None,
        typer.Option(
            "--type",
            help="Node type of --nodes on a typed graph (IDs 0..count-1 of that type; "
            "default: store-wide IDs). `hopserve models` lists the types.",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Call deadline, seconds.")] = 30.0,
    fmt: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="Output format.")
    ] = OutputFormat.json,
    max_cols: Annotated[int, typer.Option("--max-cols", help="Table: columns (0 = all).")] = 8,
    precision: Annotated[int, typer.Option("--precision", help="Table: significant digits.")] = 6,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Fetch embeddings of the given node IDs from a hopserve server and print them.

    Exit status: 0 on success, 1 when the server call fails (message on stderr), 2 on a
    bad command line.
    """
    ids = load_node_ids(nodes, nodes_file)
    connection = client_options(tls, root_certs, client_cert, client_key, token, token_file)
    fanout_list = parse_int_list(fanouts, "--fanouts") if fanouts is not None else None
    try:
        with EmbeddingClient(target, timeout=timeout, **connection) as client:
            result = client.get_embeddings_with_info(
                model,
                ids,
                fanouts=fanout_list,
                cache_policy=cache.value,
                model_version=model_version,
                seed=seed,
                node_type=node_type,
            )
    except HopserveError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    if fmt is OutputFormat.json:
        typer.echo(render_json(ids, result))
    else:
        typer.echo(render_table(ids, result, max_cols, precision))
