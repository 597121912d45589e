"""``hopserve update`` and ``hopserve compact``: change the graph a running server serves.

::

    hopserve update -t localhost:50051 -m sage --nodes new.csv --edges new-edges.csv
    hopserve update -t localhost:50051 -m sage --remove-edges gone.csv --idempotency-key b7
    hopserve update -t localhost:50051 -m sage --features changed.ndjson
    hopserve compact -t localhost:50051 -m sage

One call applies every file given as one atomic batch (new nodes, removed edges, new
edges, new feature rows, in that order), durable before it answers. File formats, by
extension (``.ndjson``/``.jsonl``, else CSV):

* nodes and features: CSV ``id,f0,f1,...`` (a header row is optional; the first column
  is the external node ID, the others its features), or NDJSON
  ``{"id": 7, "features": [0.1, 0.2]}`` per line;
* edges: CSV ``src,dst`` (optional header), or NDJSON ``{"src": 7, "dst": 9}``;
* edges to add to a graph holding edge data carry it as ingest's edge files do: CSV
  ``src,dst,weight,f1,...,fk`` (``--edge-data weight``, the default) or
  ``src,dst,f1,...,fk`` (``--edge-data features``), every row the same width; NDJSON
  ``{"src": 7, "dst": 9, "weight": 0.5, "features": [0.1, 0.2]}``. On a graph with typed
  edges each added edge names its relation: CSV ``src,dst,relation[,edge data]``
  (``--relation-column``) or NDJSON ``"relation": "clicks"``. Edges to remove take no
  edge data (removing ``src,dst`` removes it under every relation); on a graph with node
  types they may name their relation the same way, and each end is then an ID within the
  relation's node type (required where the types have their own IDs). ``--features-type``
  says which node type ``--features`` IDs are IDs within, ``--nodes-type`` the type of the
  nodes ``--nodes`` adds (a graph with node types; their IDs are new within it).

Empty lines and lines starting with ``#`` are skipped. A bad line is refused before
anything is sent, naming the file, line and value. Needs a token with scope ``admin``.
Exit status: 0 on success, 1 when the server refuses or fails, 2 on a bad command line
or file.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from hopserve.cli import app
from hopserve.cli.common import fail
from hopserve.cli.connect import (
    ClientCert,
    ClientKey,
    RootCerts,
    Tls,
    Token,
    TokenFile,
    client_options,
)
from hopserve.client import AdminClient, HopserveError

__all__ = ["EdgeRows", "InputFileError", "read_edges", "read_edges_with_data", "read_node_rows"]


class InputFileError(ValueError):
    """A nodes, features or edges file that cannot be read; names the file and line."""


_File = {"exists": True, "dir_okay": False}


def _lines(path: Path) -> list[tuple[int, str]]:
    """Non-empty, non-comment lines with their 1-based numbers."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputFileError(f"{path}: cannot read ({err})") from None
    return [
        (n, line)
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _ndjson(path: Path) -> bool:
    return path.suffix.lower() in (".ndjson", ".jsonl")


def _int(path: Path, line: int, what: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InputFileError(f"{path}:{line}: {what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise InputFileError(f"{path}:{line}: {what} must be an integer, got {value!r}") from None


def _float(path: Path, line: int, column: int | str, value: Any) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        what = column if isinstance(column, str) else f"feature {column}"
        raise InputFileError(f"{path}:{line}: {what} must be a finite number, got {value!r}")
    return number


def _records(path: Path) -> list[tuple[int, Any]]:
    """``(line, value)``: JSON objects of an NDJSON file, or CSV rows (header dropped)."""
    lines = _lines(path)
    if _ndjson(path):
        out = []
        for n, line in lines:
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as err:
                raise InputFileError(f"{path}:{n}: not JSON ({err.msg})") from None
        return out
    rows = [(n, [c.strip() for c in next(csv.reader([line]))]) for n, line in lines]
    if rows and rows[0][1] and not _is_number(rows[0][1][0]):
        rows = rows[1:]  # a header
    return rows


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_node_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int64 [n], features float32 [n, dim])`` of a nodes/features file.

    Raises:
        InputFileError: an unreadable file, a bad line (named), rows of unequal
            width, or no rows.
    """
    ids: list[int] = []
    rows: list[list[float]] = []
    for n, record in _records(path):
        if _ndjson(path):
            if not isinstance(record, dict) or "id" not in record or "features" not in record:
                raise InputFileError(
                    f'{path}:{n}: expected {{"id": ..., "features": [...]}}, got {record!r:.80}'
                )
            node, values = record["id"], record["features"]
            if not isinstance(values, list):
                raise InputFileError(f"{path}:{n}: features must be a list, got {values!r:.80}")
        else:
            node, values = record[0], record[1:]
        ids.append(_int(path, n, "the node id", node))
        rows.append([_float(path, n, k, v) for k, v in enumerate(values)])
        if not rows[-1]:
            raise InputFileError(f"{path}:{n}: node {ids[-1]} has no features")
        if len(rows[-1]) != len(rows[0]):
            raise InputFileError(
                f"{path}:{n}: node {ids[-1]} has {len(rows[-1])} features, the first row "
                f"{len(rows[0])}"
            )
    if not ids:
        raise InputFileError(f"{path}: no nodes")
    return np.asarray(ids, dtype=np.int64), np.asarray(rows, dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class EdgeRows:
    """The edges of an edges file and the edge data they carry (``None``: not given)."""

    src: np.ndarray  # int64 [k]
    dst: np.ndarray  # int64 [k]
    weights: np.ndarray | None = None  # float32 [k]
    features: np.ndarray | None = None  # float32 [k, d_e]
    relations: list[str] | None = None  # a relation name per edge

    def update_fields(self) -> dict[str, Any]:
        """The :meth:`AdminClient.update_graph` arguments of edges to add."""
        return {
            "add_edges": (self.src, self.dst),
            "edge_weights": self.weights,
            "edge_features": self.features,
            "edge_relations": self.relations,
        }


def read_edges(path: Path, *, relation_column: bool = False) -> EdgeRows:
    """The edges of an edges file without edge data (edges to remove), with their
    relations when they name them (``relation_column``: the third CSV column).

    Raises:
        InputFileError: an unreadable file, a bad line (named), edge data, or no edges.
    """
    return _edge_rows(path, data=False, relation_column=relation_column)


def read_edges_with_data(
    path: Path, edge_data: str = "weight", *, relation_column: bool = False
) -> EdgeRows:
    """The edges of an edges file with their edge data, if the file has any (see the
    module docstring; ``edge_data``: what a CSV's extra columns are, ``"weight"`` or
    ``"features"``; ``relation_column``: the third CSV column is the relation name).

    Raises:
        InputFileError: an unreadable file, a bad line (named), rows of unequal width,
            or no edges.
    """
    return _edge_rows(path, edge_data=edge_data, relation_column=relation_column)


def _edge_rows(
    path: Path, *, data: bool = True, edge_data: str = "weight", relation_column: bool = False
) -> EdgeRows:
    """One parser for every edges file: ``data=False`` refuses edge data (named line)."""
    src: list[int] = []
    dst: list[int] = []
    weights: list[float] = []
    feats: list[list[float]] = []
    relations: list[str] = []
    shape = None  # (relation, weight, feature count) of the first row; every row must match
    for n, record in _records(path):
        if _ndjson(path):
            if not isinstance(record, dict) or "src" not in record or "dst" not in record:
                raise InputFileError(
                    f'{path}:{n}: expected {{"src": ..., "dst": ...}}, got {record!r:.80}'
                )
            a, b = record["src"], record["dst"]
            r, w = record.get("relation"), record.get("weight")
            f = record.get("features", [])
            if not isinstance(f, list):
                raise InputFileError(f"{path}:{n}: features must be a list, got {f!r:.80}")
        else:
            most = 2 + relation_column  # removals: src,dst[,relation]
            if len(record) < 2 or (not data and len(record) > most):
                want = "src,dst[,relation]" if relation_column else "src,dst"
                raise InputFileError(
                    f"{path}:{n}: expected {most} columns {want}, got {len(record)}"
                )
            a, b, *extra = record
            r = extra.pop(0) if relation_column and extra else None
            w, f = (extra[0], extra[1:]) if extra and edge_data == "weight" else (None, extra)
        row = (r is not None, w is not None, len(f))
        if not data and (row[1] or row[2]):
            raise InputFileError(f"{path}:{n}: edges to remove take no edge data")
        if shape is None:
            shape = row
        elif row != shape:
            raise InputFileError(
                f"{path}:{n}: edge data {_describe(row)}, the first row {_describe(shape)}"
            )
        src.append(_int(path, n, "src", a))
        dst.append(_int(path, n, "dst", b))
        if r is not None:
            if not isinstance(r, str | int) or isinstance(r, bool) or not str(r).strip():
                raise InputFileError(f"{path}:{n}: relation must be a name, got {r!r:.80}")
            relations.append(str(r).strip())
        if w is not None:
            weights.append(_float(path, n, "weight", w))
        feats.append([_float(path, n, k, v) for k, v in enumerate(f)])
    if not src:
        raise InputFileError(f"{path}: no edges")
    has_relation, has_weight, width = shape
    return EdgeRows(
        np.asarray(src, dtype=np.int64),
        np.asarray(dst, dtype=np.int64),
        np.asarray(weights, dtype=np.float32) if has_weight else None,
        np.asarray(feats, dtype=np.float32) if width else None,
        relations if has_relation else None,
    )


def _describe(shape: tuple[bool, bool, int]) -> str:
    relation, weight, width = shape
    parts = (
        (["a relation"] if relation else [])
        + (["a weight"] if weight else [])
        + ([f"{width} features"] if width else [])
    )
    return " and ".join(parts) or "none"


Target = Annotated[str, typer.Option("--target", "-t", help="Server address, HOST:PORT.")]
Model = Annotated[str, typer.Option("--model", "-m", help="A model served on the graph.")]


@app.command("update")
def update_cmd(
    model: Model,
    nodes: Annotated[
        Path | None, typer.Option("--nodes", **_File, help="New nodes: CSV id,f0,... or NDJSON.")
    ] = None,
    edges: Annotated[
        Path | None,
        typer.Option("--edges", **_File, help="Edges to add: CSV src,dst[,edge data] or NDJSON."),
    ] = None,
    edge_data: Annotated[
        str,
        typer.Option(
            "--edge-data",
            help="What extra CSV columns of --edges are: 'weight' (the third column is the "
            "weight, further ones features) or 'features' (all are features).",
        ),
    ] = "weight",
    relation_column: Annotated[
        bool,
        typer.Option(
            "--relation-column",
            help="The third CSV column of --edges (and --remove-edges) is each edge's "
            "relation name (a graph with typed edges; edge data columns follow it). NDJSON: "
            'a "relation" key.',
        ),
    ] = False,
    remove_edges: Annotated[
        Path | None,
        typer.Option("--remove-edges", **_File, help="Edges to remove (every copy)."),
    ] = None,
    features: Annotated[
        Path | None,
        typer.Option("--features", **_File, help="New feature rows of existing nodes."),
    ] = None,
    features_type: Annotated[
        str | None,
        typer.Option(
            "--features-type",
            help="The node type whose IDs --features names (a graph with node types).",
        ),
    ] = None,
    nodes_type: Annotated[
        str | None,
        typer.Option(
            "--nodes-type",
            help="The node type of the nodes --nodes adds (a graph with node types).",
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="Makes a retry of this batch safe."),
    ] = None,
    target: Target = "localhost:50051",
    timeout: Annotated[float, typer.Option("--timeout", help="Call deadline, seconds.")] = 60.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Apply one atomic batch of graph changes (prints the outcome as JSON)."""
    if not any((nodes, edges, remove_edges, features)):
        fail("give at least one of --nodes, --edges, --remove-edges, --features")
    if features_type is not None and not features:
        fail("--features-type needs --features")
    if nodes_type is not None and not nodes:
        fail("--nodes-type needs --nodes")
    if edge_data not in ("weight", "features"):
        fail(f"--edge-data must be 'weight' or 'features', got {edge_data!r}")
    try:
        batch = {
            "add_nodes": read_node_rows(nodes) if nodes else None,
            "set_features": read_node_rows(features) if features else None,
            "set_node_type": features_type,
            "add_node_type": nodes_type,
        }
        if remove_edges:
            removed = read_edges(remove_edges, relation_column=relation_column)
            batch |= {
                "remove_edges": (removed.src, removed.dst),
                "remove_relations": removed.relations,
            }
        if edges:
            rows = read_edges_with_data(edges, edge_data, relation_column=relation_column)
            batch |= rows.update_fields()
    except InputFileError as err:
        fail(str(err))
    options = client_options(tls, root_certs, client_cert, client_key, token, token_file)
    try:
        with AdminClient(target, timeout=timeout, **options) as admin:
            result = admin.update_graph(model, idempotency_key=idempotency_key, **batch)
    except HopserveError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(json.dumps(dataclasses.asdict(result)))


@app.command("compact")
def compact_cmd(
    model: Model,
    target: Target = "localhost:50051",
    timeout: Annotated[float, typer.Option("--timeout", help="Call deadline, seconds.")] = 60.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Fold the update log of the model's graph into a new base store (prints its state)."""
    options = client_options(tls, root_certs, client_cert, client_key, token, token_file)
    try:
        with AdminClient(target, timeout=timeout, **options) as admin:
            info = admin.compact_graph(model)
    except HopserveError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(json.dumps(dataclasses.asdict(info)))
