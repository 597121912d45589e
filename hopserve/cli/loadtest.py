"""``hopserve loadtest``: closed-loop load against a running server (client SDK only)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

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


@app.command()
def loadtest(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name.")],
    target: Annotated[str, typer.Option("--target", "-t", help="host:port")] = "localhost:50051",
    concurrency: Annotated[int, typer.Option(min=1, help="Closed-loop clients.")] = 32,
    duration: Annotated[float, typer.Option(min=0.1, help="Measured seconds.")] = 10.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Unrecorded seconds first.")] = 1.0,
    set_size: Annotated[int, typer.Option(min=1, help="Median targets per request.")] = 16,
    set_size_sigma: Annotated[float, typer.Option(help="Log-normal spread of sizes.")] = 0.0,
    zipf: Annotated[float, typer.Option(help="Popularity exponent (P ∝ rank^-a).")] = 1.1,
    cache: Annotated[str, typer.Option(help="use | refresh | bypass")] = "use",
    fanouts: Annotated[str | None, typer.Option(help="Per-layer fanouts, e.g. 10,10.")] = None,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    nodes_file: Annotated[
        Path | None,
        typer.Option(
            "--nodes-file",
            "--graph",
            help="Node IDs to query: the model's graph-store directory (its ID map), a "
            ".npy array or a text/CSV file with one ID per line. Default: 0..N-1, which "
            "only fits graphs ingested without external IDs.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Report QPS and p50/p95/p99 latency at a given concurrency."""
    from hopserve.client.loadtest import LoadSpec, read_node_ids, run_load

    connection = client_options(tls, root_certs, client_cert, client_key, token, token_file)
    node_ids = None
    if nodes_file is not None:
        try:
            node_ids = read_node_ids(nodes_file)
        except (OSError, ValueError, KeyError) as err:
            typer.echo(f"error: --nodes-file {nodes_file}: {err}", err=True)
            raise typer.Exit(2) from None
    spec = LoadSpec(
        model=model,
        concurrency=concurrency,
        duration_s=duration,
        warmup_s=warmup,
        set_size=set_size,
        set_size_sigma=set_size_sigma,
        zipf_a=zipf,
        cache_policy=cache,
        fanouts=[int(f) for f in fanouts.split(",")] if fanouts else None,
        seed=seed,
        node_ids=node_ids,
    )
    report = asyncio.run(run_load(target, spec, **connection))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    typer.echo(
        f"{report.requests} requests in {report.seconds:.1f}s at concurrency "
        f"{report.concurrency}: {report.qps:.1f} QPS, p50 {report.p50_ms:.2f} ms, "
        f"p95 {report.p95_ms:.2f} ms, p99 {report.p99_ms:.2f} ms, "
        f"{report.targets_per_request:.1f} targets/request, errors {report.errors or 0}"
    )
    if report.first_error:
        hint = (
            " (the IDs drawn are 0..N-1; pass --graph <graph dir> or --nodes-file)"
            if nodes_file is None and "[INVALID_ARGUMENT]" in report.first_error
            else ""
        )
        typer.echo(f"first error: {report.first_error}{hint}", err=True)
