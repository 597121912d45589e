"""``hopserve demo``: the main job on embedded defaults (``make demo``).

1. Builds (once) a synthetic SBM graph and trains a small GraphSAGE for a few seconds.
2. Engine: full and partial layer-wise evaluation with timings, checked against the
   model's own full-graph forward.
3. Service: starts hopserve with an in-process worker (Redis if one answers at
   127.0.0.1:6379, else the embedded LRU cache), runs a scripted client session (cold vs
   cached latency, concurrent requests coalescing, sampling), prints where the metrics
   are, and keeps serving until interrupted (``--once`` exits after the script).
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Annotated

import typer

from hopserve.cli import app

MODEL = "sage"


def _port_or_free(preferred: int) -> int:
    """``preferred`` if it is free, else (or for 0) a free loopback port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_briefly(model, store, seconds: float) -> float:
    """Full-batch training on the store for ``seconds``; returns training accuracy."""
    import torch
    import torch.nn.functional as F

    dst = torch.repeat_interleave(torch.arange(store.num_nodes), store.in_degrees)
    edge_index = torch.stack([store.indices.long(), dst])
    x, y = store.features.float(), store.labels
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        opt.zero_grad()
        F.cross_entropy(model(x, edge_index), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(x, edge_index).argmax(1) == y).float().mean())


def _prepare(workdir: Path, nodes: int, train_seconds: float, console) -> tuple[dict, object]:
    """Graph + trained weights on disk; returns the model kwargs and the model."""
    import torch

    from hopserve import GraphStore
    from hopserve.examples import GraphSAGE
    from hopserve.worker.graph.synth import synth_sbm

    graph_dir = workdir / f"sbm-{nodes}"
    if not (graph_dir / "meta.json").exists():
        t = time.perf_counter()
        synth_sbm(nodes, 8, 12.0, 64, seed=0, symmetrize=True, out=graph_dir, overwrite=True)
        console.print(f"built {graph_dir} in {time.perf_counter() - t:.1f}s")
    store = GraphStore.open(graph_dir)
    console.print(f"graph: {store}")
    kwargs = {"in_dim": store.feature_dim, "hidden": 64, "out_dim": 8, "num_layers": 2}
    torch.manual_seed(0)
    model = GraphSAGE(**kwargs)
    acc = train_briefly(model, store, train_seconds)
    torch.save(model.state_dict(), workdir / "sage.pt")
    console.print(f"trained GraphSAGE for {train_seconds:.0f}s: training accuracy {acc:.1%}")
    return {"graph": graph_dir, "kwargs": kwargs, "store": store}, model


def _engine_part(model, store, console):
    """Full and partial evaluation timings; returns the full result (exact reference)."""
    import torch
    from rich.table import Table

    from hopserve import LayerwiseEvaluator

    ev = LayerwiseEvaluator(model, store, progress=True)
    console.print("ConvBlocks:\n" + ev.describe())
    table = Table(title="engine: layer-wise evaluation (in process)")
    for col in ("job", "targets", "frontiers |V^0..V^L|", "batches", "seconds"):
        table.add_column(col)

    def run(job: str, **kw):
        t = time.perf_counter()
        out = ev.evaluate(**kw)
        s = ev.last_stats
        table.add_row(
            job,
            f"{out.shape[0]:,}",
            str(s.frontier_sizes),
            str(s.batches),
            f"{time.perf_counter() - t:.3f}",
        )
        return out

    full = run("full")
    ids = torch.randint(0, store.num_nodes, (100,), generator=torch.Generator().manual_seed(1))
    run("partial (100 targets)", targets=ids)
    run("sampling [5, 5]", targets=ids, fanouts=[5, 5])
    console.print(table)
    dst = torch.repeat_interleave(torch.arange(store.num_nodes), store.in_degrees)
    with torch.no_grad():
        ref = model(store.features.float(), torch.stack([store.indices.long(), dst]))
    order = store.sorted_external_order()
    ref = ref[order]
    console.print(
        f"exactness: max |layer-wise − full-graph forward| = {(full - ref).abs().max():.2e}"
    )
    ev.close()
    return full


async def _service_part(cfg, full, console, once: bool) -> None:
    import numpy as np

    from hopserve.client import AsyncEmbeddingClient
    from hopserve.server.app import build_server

    service = await build_server(cfg)
    await service.start()
    await service.wait_ready(120)
    target = f"127.0.0.1:{service.port}"
    cache_name = service.cache.name
    console.print(
        f"serving model '{MODEL}' on {target} (cache: {cache_name}); "
        f"metrics at http://127.0.0.1:{service.metrics_port}/metrics"
    )
    full_np = full.numpy()
    rng = np.random.default_rng(7)
    async with AsyncEmbeddingClient(target) as client:
        ids = rng.choice(full_np.shape[0], 16, replace=False)
        for label, policy in (
            ("cold (computed)", "refresh"),
            ("cached", "use"),
            ("cached again", "use"),
        ):
            t = time.perf_counter()
            res = await client.get_embeddings_with_info(MODEL, ids, cache_policy=policy)
            ms = (time.perf_counter() - t) * 1e3
            console.print(
                f"  16 nodes, {label:<16} {ms:7.2f} ms   cache hits {res.cache_hits:2d}"
                f"   max |served − engine| {np.abs(res.embeddings - full_np[ids]).max():.1e}"
            )

        def batch_totals() -> tuple[float, float]:
            reg, labels = service.metrics.registry, {"model": MODEL}
            return (
                reg.get_sample_value("hopserve_batch_requests_sum", labels) or 0.0,
                reg.get_sample_value("hopserve_batch_requests_count", labels) or 0.0,
            )

        sets = [rng.choice(full_np.shape[0], 64, replace=False) for _ in range(32)]
        before = batch_totals()
        t = time.perf_counter()
        outs = await asyncio.gather(
            *(client.get_embeddings(MODEL, s, cache_policy="bypass") for s in sets)
        )
        ms = (time.perf_counter() - t) * 1e3
        err = max(float(np.abs(o - full_np[s]).max()) for o, s in zip(outs, sets, strict=True))
        after = batch_totals()
        reqs, batches = after[0] - before[0], after[1] - before[1]
        console.print(
            f"  32 concurrent requests × 64 nodes: {ms:.1f} ms, max error {err:.1e}, "
            f"{reqs:.0f} requests in {batches:.0f} batches ({reqs / max(batches, 1):.1f} per batch)"
        )
        a = await client.get_embeddings(MODEL, ids[:4], fanouts=[5, 5], seed=3)
        b = await client.get_embeddings(MODEL, ids[:4], fanouts=[5, 5], seed=3)
        console.print(f"  sampling [5, 5] seed 3: reproducible {bool(np.array_equal(a, b))}")
    console.print(f"try: hopserve query --target {target} --model {MODEL} --nodes 1,2,3")
    try:
        if not once:
            console.print("serving until Ctrl-C …")
            await service.wait_for_termination()
    finally:
        await service.stop(1.0)


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option(help="Where graph and weights are kept.")] = Path(
        "data/demo"
    ),
    nodes: Annotated[int, typer.Option(min=100, help="Synthetic graph size.")] = 50_000,
    train_seconds: Annotated[float, typer.Option(help="Training time before serving.")] = 5.0,
    cache: Annotated[str, typer.Option(help="auto (Redis if it answers) | memory | none")] = "auto",
    port: Annotated[int, typer.Option(help="gRPC port (a free one if taken).")] = 50051,
    metrics_port: Annotated[int, typer.Option(help="Metrics port (free one if taken).")] = 9090,
    once: Annotated[bool, typer.Option("--once", help="Exit after the scripted session.")] = False,
) -> None:
    """Train a small GraphSAGE, evaluate it layer-wise, serve it and query it."""
    from rich.console import Console

    from hopserve.config import HopserveConfig

    console = Console()
    workdir.mkdir(parents=True, exist_ok=True)
    prepared, model = _prepare(workdir, nodes, train_seconds, console)
    full = _engine_part(model, prepared["store"], console)
    cfg = HopserveConfig.model_validate({
        "models": [{
            "name": MODEL,
            "entrypoint": "hopserve.examples:GraphSAGE",
            "kwargs": prepared["kwargs"],
            "weights": str(workdir / "sage.pt"),
            "graph": str(prepared["graph"]),
        }],
        "server": {"host": "127.0.0.1", "port": _port_or_free(port),
                   "metrics_port": _port_or_free(metrics_port), "max_wait_ms": 2.0},
        "cache": {"backend": cache, "redis_url": "redis://127.0.0.1:6379/0"},
    })  # fmt: skip
    try:
        asyncio.run(_service_part(cfg, full, console, once))
    except KeyboardInterrupt:
        console.print("stopped")
