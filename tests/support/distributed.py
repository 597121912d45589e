"""Run a function in N gloo ranks on loopback, the way ``torchrun`` would set them up.

The ranks are started by a fork server that has torch, PyG and the engine imported
already (started once per test session), so a 4-rank job costs a fork per rank, not four
interpreter start-ups. ``fn`` must be importable by name (a module-level function).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as tmp

from hopserve.testing import free_port

PRELOAD = ["torch", "torch_geometric", "hopserve.worker.distributed.job", "support.models"]


def _rank_main(
    rank: int, world: int, port: int, env: dict[str, str], fn: Callable, args: tuple
) -> None:
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    fn(*args)


def run_ranks(
    world: int, fn: Callable, *args: Any, env: dict[str, str] | None = None, timeout: float = 120
) -> None:
    """``fn(*args)`` in ``world`` processes, ranks ``0..world-1`` of one gloo job, with
    ``env`` added to their environment.

    Raises when a rank fails (``torch.multiprocessing.ProcessRaisedException`` for an
    exception, ``ProcessExitedException`` for an exit code); the other ranks are then
    terminated.
    """
    multiprocessing.set_forkserver_preload(PRELOAD)
    ctx = tmp.start_processes(
        _rank_main,
        args=(world, free_port(), dict(env or {}), fn, args),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            raise TimeoutError(f"{world} ranks of {fn.__name__} still running after {timeout}s")


def embed_families(graph_dir: str, d_in: int, families: list[str], out_root: str) -> None:
    """Rank body: ``embed_all`` of each family's model (``support.models.build``) into
    ``out_root/<family>/out``, checkpoints in ``out_root/<family>/ckpt``, and what it did
    (resume point, per-layer reports) in ``out_root/<family>/report-RANK.json``."""
    from hopserve import GraphStore
    from hopserve.worker.distributed import embed_all
    from hopserve.worker.distributed.exchange import Comm
    from support.models import build

    graph = GraphStore.open(graph_dir)
    comm = Comm.from_env("cpu", timeout_s=60)
    try:
        for family in families:
            model = build(family, d_in)
            root = os.path.join(out_root, family)
            result = embed_all(
                model,
                graph,
                os.path.join(root, "out"),
                checkpoint_dir=os.path.join(root, "ckpt"),
                comm=comm,
                progress=False,
                init_batch_nodes=17,  # several batches per rank and layer
            )
            report = {
                "resumed_after": result.resumed_after,
                "layers": [vars(r) for r in result.layers],
            }
            with open(os.path.join(root, f"report-{comm.rank}.json"), "w") as f:
                json.dump(report, f)
    finally:
        comm.close()
