"""``hopserve embed-all``: every node's embedding as an offline job, written as Parquet.

::

    hopserve embed-all --graph graph --entrypoint my_models:SAGE \\
        --kwargs '{"in_dim": 32, "hidden": 64, "out_dim": 16}' --weights sage.pt --out emb
    torchrun --nproc-per-node 4 -m hopserve embed-all --graph graph ... --out emb
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint host0:29400 -m hopserve embed-all ...

Alone it runs single-process; under ``torchrun`` each process is one rank of a 1-D
partition (gloo between CPU ranks, NCCL with ``--device cuda``). Each rank writes
``OUT/part-RANK-of-WORLD.parquet``; rank 0 writes ``OUT/_SUCCESS.json`` last. Layer
checkpoints go to ``OUT/_checkpoints`` unless ``--checkpoint-dir`` says otherwise; run
the same command again after a failure and it resumes after the last layer every rank
finished. Bad input exits with code 2 and one ``error: ...`` line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from hopserve.cli import app
from hopserve.cli.common import fail

log = logging.getLogger("hopserve.embed")


@app.command("embed-all")
def embed_all_cmd(
    graph: Annotated[Path, typer.Option("--graph", "-g", help="Graph-store directory.")],
    entrypoint: Annotated[
        str, typer.Option("--entrypoint", "-e", help="The model class: 'package.module:Class'.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output directory for the Parquet shards.")
    ],
    weights: Annotated[
        Path | None,
        typer.Option("--weights", "-w", help="state_dict file (torch.load weights_only=True)."),
    ] = None,
    kwargs: Annotated[
        str, typer.Option("--kwargs", help="Constructor keyword arguments as a JSON object.")
    ] = "{}",
    weights_key: Annotated[
        str | None,
        typer.Option("--weights-key", help="Key of the state_dict inside a checkpoint dict."),
    ] = None,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option("--checkpoint-dir", help="Layer checkpoints (default: OUT/_checkpoints)."),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", "-d", help="'cpu' (gloo) or 'cuda' (NCCL, GPU LOCAL_RANK).")
    ] = "cpu",
    name: Annotated[
        str | None,
        typer.Option("--name", help="Model name in the metadata (default: the class name)."),
    ] = None,
    model_version: Annotated[
        str, typer.Option("--model-version", help="Model version in the metadata.")
    ] = "1",
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="Progress bars (default: on a TTY)."),
    ] = None,
) -> None:
    """Compute every node's embedding layer by layer and write Parquet shards."""
    try:
        kw = json.loads(kwargs)
    except ValueError as err:
        fail(f"--kwargs is not JSON: {err}")
    if not isinstance(kw, dict):
        fail(f"--kwargs must be a JSON object, got {kwargs!r}")
    if device not in ("cpu", "cuda"):
        fail(f"--device must be 'cpu' or 'cuda', got {device!r} (ranks take GPU LOCAL_RANK)")

    import torch

    from hopserve.worker.distributed import CheckpointMismatchError, JobIdentity, embed_all
    from hopserve.worker.graph import GraphFormatError, GraphStore
    from hopserve.worker.loader import ModelLoadError, load_model
    from hopserve.worker.trace.tracer import ModelTraceError

    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is available")
    try:
        store = GraphStore.open(graph)
    except (GraphFormatError, OSError) as err:
        fail(f"--graph {graph}: {err}")
    try:
        model = load_model(
            entrypoint, kw, weights, search_path=[Path.cwd()], weights_key=weights_key
        )
    except ModelLoadError as err:
        fail(str(err))
    identity = JobIdentity.of(model, store, name, model_version, entrypoint=entrypoint, kwargs=kw)
    try:
        result = embed_all(
            model,
            store,
            out,
            identity=identity,
            checkpoint_dir=checkpoint_dir if checkpoint_dir is not None else out / "_checkpoints",
            device=device,
            progress=progress,
        )
    except (CheckpointMismatchError, FileExistsError) as err:
        fail(str(err))
    except ModelTraceError as err:
        fail(f"{entrypoint}: the layer-wise engine cannot split this model: {err}")
    if result.rank == 0:
        resumed = (
            f", resumed after block {result.resumed_after}"
            if result.resumed_after is not None
            else ""
        )
        typer.echo(
            f"wrote {store.num_nodes:,} embeddings of {identity.model_name} to {out} "
            f"({result.world_size} shard(s)) in {result.total_s:.1f}s{resumed}"
        )
