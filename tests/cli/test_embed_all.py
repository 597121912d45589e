"""``hopserve embed-all``: alone, and as a ``torchrun`` job that loses a rank mid-job and
resumes from its checkpoints when torchrun restarts it (2 ranks: each one is a fresh
interpreter importing torch and PyG; the 4-rank gloo tests are in tests/worker/distributed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from support import assert_exact, random_edge_index
from support.models import build
from support.processes import child_env
from typer.testing import CliRunner

from hopserve import GraphStore
from hopserve.cli import app
from hopserve.worker.distributed.halo import halo_ids, recv_counts
from hopserve.worker.distributed.output import read_embeddings
from hopserve.worker.distributed.partition import partition_by_edges

N, D_IN = 400, 6
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A graph store (shuffled external IDs), GraphSAGE weights, and the forward's rows in
    ascending external ID."""
    folder = tmp_path_factory.mktemp("embed")
    edge_index = random_edge_index(N, 2400, seed=11)
    x = torch.randn(N, D_IN, generator=torch.Generator().manual_seed(12))
    ids = torch.randperm(N, generator=torch.Generator().manual_seed(13)) + 50
    GraphStore.from_edge_index(edge_index, x, node_ids=ids).save(folder / "graph")
    model = build("sage_mean", D_IN)
    torch.save(model.state_dict(), folder / "sage.pt")
    with torch.no_grad():
        want = model(x, edge_index)[torch.argsort(ids)]
    args = ["--graph", str(folder / "graph"), "--entrypoint", "support.models:GraphSAGE",
            "--kwargs", json.dumps({"d_in": D_IN}), "--weights", str(folder / "sage.pt"),
            "--no-progress"]  # fmt: skip
    return {"args": args, "want": want, "graph": folder / "graph"}


def test_one_process(job: dict, tmp_path: Path) -> None:
    out = tmp_path / "emb"
    result = CliRunner().invoke(app, ["embed-all", *job["args"], "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 400 embeddings of GraphSAGE" in result.output
    ids, emb, meta = read_embeddings(out)
    assert_exact(torch.from_numpy(emb), job["want"], "embed-all, one process")
    assert meta["hopserve.model_version"] == "1"
    assert meta["hopserve.graph_version"] == GraphStore.open(job["graph"]).version
    schema = pq.read_schema(out / "part-00000-of-00001.parquet")
    assert str(schema.field("embedding").type) == "fixed_size_list<element: float>[5]"
    assert (out / "_checkpoints" / "rank-00000" / "manifest.json").is_file()

    # Same checkpoints, another model version: refused, one line, exit code 2.
    again = CliRunner().invoke(
        app, ["embed-all", *job["args"], "--out", str(out), "--model-version", "2"]
    )
    assert again.exit_code == 2
    assert "error: checkpoint" in again.output and "model_version '1'" in again.output


def test_bad_kwargs(job: dict, tmp_path: Path) -> None:
    args = [a if a != json.dumps({"d_in": D_IN}) else "[1]" for a in job["args"]]
    result = CliRunner().invoke(app, ["embed-all", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--kwargs must be a JSON object" in result.output


def test_torchrun_restart_resumes(job: dict, tmp_path: Path) -> None:
    """2 ranks under torchrun with one restart allowed: rank 1 dies after block 1, torchrun
    restarts the group, the job resumes from the checkpoints and finishes exactly."""
    # Precondition of the crash hook's promise: rank 1 receives rows from rank 0, so when
    # it has exchanged block 1, rank 0 has checkpointed block 1 too.
    topo = GraphStore.open(job["graph"]).topology
    part = partition_by_edges(topo.indptr, 2)
    assert recv_counts(part, halo_ids(topo.indptr, topo.indices, *part.range(1)))[0] > 0

    out = tmp_path / "emb"
    argv = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
            "-m", "hopserve", "embed-all", *job["args"], "--out", str(out)]  # fmt: skip
    env = child_env() | {"HOPSERVE_EMBED_ALL_CRASH": "1:1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1: HOPSERVE_EMBED_ALL_CRASH=1:1: exiting after block 1" in proc.stderr
    assert "resumed after block 1" in proc.stdout
    ids, emb, meta = read_embeddings(out)
    np.testing.assert_array_equal(ids, np.arange(50, 50 + N))
    assert_exact(torch.from_numpy(emb), job["want"], "embed-all, 2 ranks, restarted")
    assert meta["hopserve.world_size"] == "2"
    assert sorted(os.listdir(out)) == [
        "_SUCCESS.json", "_checkpoints", "part-00000-of-00002.parquet",
        "part-00001-of-00002.parquet",
    ]  # fmt: skip
