"""``hopserve models``: list, load, switch and unload model versions on a running server.

Uses the client SDK only (no torch, no YAML parser: the server parses the entry)::

    hopserve models list   -t localhost:50051
    hopserve models load   -t localhost:50051 --file sage-v2.yaml --default --replace
    hopserve models default -t localhost:50051 -m sage -V 2 --canary 3 --canary-percent 10
    hopserve models unload -t localhost:50051 -m sage -V 1

``load --file`` sends one entry of a config file's ``models:`` list (YAML or JSON, paths
resolved on the server); the version is loaded and self-checked beside the served ones,
then (``--default``) made the default at once; ``--replace`` then unloads the versions
it replaced once their requests in flight are answered. ``load``, ``default`` and
``unload`` need a token with scope ``admin``; ``list`` and ``--replace`` also read the
served models (scope ``embeddings:read``).

Exit status: 0 on success, 1 when a server call fails (``error: [STATUS] ...`` on
stderr), 2 on a bad command line.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Annotated, Any

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
from hopserve.client import AdminClient, EmbeddingClient, HopserveError, ModelInfo

models_app = typer.Typer(
    name="models",
    help="List, load, switch and unload model versions on a running server.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")


class OutputFormat(enum.StrEnum):
    """``--format`` choices."""

    table = "table"
    json = "json"


Target = Annotated[str, typer.Option("--target", "-t", help="Server address, HOST:PORT.")]
Name = Annotated[str, typer.Option("--model", "-m", help="Model name.")]
Version = Annotated[str, typer.Option("--version", "-V", help="Model version.")]
Timeout = Annotated[float, typer.Option("--timeout", help="Call deadline, seconds.")]
Format = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]


def render(models: list[ModelInfo], fmt: OutputFormat) -> str:
    """Versions as an aligned table (name, version, state, default, traffic, dim, layers,
    graph; node types when a graph has them) or as a JSON list."""
    if fmt is OutputFormat.json:
        return json.dumps(
            [
                {k: v for k, v in dataclasses.asdict(m).items() if k not in ("blocks",)}
                for m in models
            ]
        )
    rows = [["model", "version", "state", "default", "traffic", "dim", "layers", "graph"]]
    rows += [
        [
            m.name,
            m.version,
            m.state or ("ready" if m.ready else "loading"),
            "*" if m.is_default else "",
            f"{m.traffic_percent}%",
            str(m.dim),
            str(m.num_layers),
            f"{m.graph_version[:12]}@{m.graph_seq}",
        ]  # fmt: skip
        for m in models
    ]
    if any(m.node_types for m in models):  # typed graphs: the types `query --type` takes
        rows[0].append("node types")
        for row, m in zip(rows[1:], models, strict=True):
            row.append(
                ", ".join(
                    f"{t.name} ({t.count:,}{', own IDs' if t.own_ids else ''}{_output_width(t, m)})"
                    for t in m.node_types
                )
                or "-"
            )
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip


def _connection(**options: Any) -> dict[str, Any]:
    return client_options(
        options["tls"], options["root_certs"], options["client_cert"], options["client_key"],
        options["token"], options["token_file"],
    )  # fmt: skip


def _fail(err: HopserveError) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(code=1)


@models_app.command("list")
def list_cmd(
    target: Target = "localhost:50051",
    fmt: Format = OutputFormat.table,
    timeout: Timeout = 30.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Every served version: state, default, share of unversioned traffic."""
    options = _connection(**locals())
    try:
        with EmbeddingClient(target, timeout=timeout, **options) as client:
            typer.echo(render(client.list_models(), fmt))
    except HopserveError as err:
        _fail(err)


@models_app.command("load")
def load_cmd(
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            exists=True,
            dir_okay=False,
            help="One models: entry, YAML or JSON (paths are resolved on the server).",
        ),
    ] = None,
    entry: Annotated[
        str | None, typer.Option("--entry", help="The entry inline instead of --file.")
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Make it the default once it is ready.")
    ] = False,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="With --default: then unload the name's other versions (after their "
            "requests in flight are answered).",
        ),
    ] = False,
    target: Target = "localhost:50051",
    fmt: Format = OutputFormat.table,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Deadline of the load, seconds.")
    ] = 300.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Load a model version beside the served ones (self-checked before it serves)."""
    if (file is None) == (entry is None):
        raise typer.BadParameter("give exactly one of --file and --entry")
    if replace and not default:
        raise typer.BadParameter("--replace needs --default (only a default replaces others)")
    text = file.read_text("utf-8") if file is not None else entry
    options = _connection(**locals())
    try:
        with AdminClient(target, timeout=timeout, **options) as admin:
            info = admin.load_model(text, make_default=default)  # type: ignore[arg-type]
            shown = [info]
            if replace:
                with EmbeddingClient(target, timeout=timeout, **options) as client:
                    others = [m for m in client.list_models() if m.name == info.name]
                for other in others:
                    if other.version != info.version:
                        done = admin.unload_model(other.name, other.version)
                        typer.echo(
                            f"unloaded {other.name}:{done.version} "
                            f"({done.drained_requests} requests drained)",
                            err=True,
                        )
        typer.echo(render(shown, fmt))
    except HopserveError as err:
        _fail(err)


@models_app.command("default")
def default_cmd(
    name: Name,
    version: Version,
    canary: Annotated[
        str, typer.Option("--canary", help="Version that gets --canary-percent of traffic.")
    ] = "",
    canary_percent: Annotated[
        int, typer.Option("--canary-percent", min=0, max=100, help="Share for --canary.")
    ] = 0,
    target: Target = "localhost:50051",
    fmt: Format = OutputFormat.table,
    timeout: Timeout = 30.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Make a ready version the default of its name (optionally with a canary split)."""
    options = _connection(**locals())
    try:
        with AdminClient(target, timeout=timeout, **options) as admin:
            info = admin.set_default_model(name, version, canary, canary_percent)
        typer.echo(render([info], fmt))
    except HopserveError as err:
        _fail(err)


@models_app.command("unload")
def unload_cmd(
    name: Name,
    version: Version,
    target: Target = "localhost:50051",
    timeout: Annotated[
        float, typer.Option("--timeout", help="Deadline (drain included), seconds.")
    ] = 300.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Unload a version once its requests in flight are answered (not the default while
    other versions remain)."""
    options = _connection(**locals())
    try:
        with AdminClient(target, timeout=timeout, **options) as admin:
            done = admin.unload_model(name, version)
    except HopserveError as err:
        _fail(err)
    typer.echo(f"unloaded {name}:{done.version} ({done.drained_requests} requests drained)")


def _output_width(t, m) -> str:  # noqa: ANN001 - a NodeTypeInfo and its ModelInfo
    """Where a type's embeddings are not the model's full width: how wide they are (a
    server that predates ``output_dim`` sends 0: nothing is said then)."""
    if m.output_types and t.name not in m.output_types:
        return ", no embeddings"
    if t.output_dim in (0, m.dim):
        return ""
    return f", {t.output_dim} of {m.dim} wide"
