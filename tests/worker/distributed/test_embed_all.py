"""``embed_all``: every node's embedding, on one rank or four, equals the model's forward.

The 4-rank job runs GCN (whole-graph degree normalization), GraphSAGE and a jumping-
knowledge model with residuals (later blocks read earlier values) in one gloo process
group on loopback; each rank owns a contiguous slice of the RCMK order and receives its
halo rows per layer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from support import assert_exact, random_edge_index
from support.distributed import embed_families, run_ranks
from support.models import build
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.distributed import CheckpointMismatchError, JobIdentity, embed_all
from hopserve.worker.distributed.output import SUCCESS, read_embeddings

FAMILIES = ["gcn", "sage_mean", "jk_cat"]
N, D_IN = 400, 6


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.Tensor, ...]:
    """``(edge_index, x, ids, store_dir)``: 400 nodes, row ``i`` of ``x`` has the shuffled
    external ID ``ids[i]``; stored in RCMK order."""
    edge_index = random_edge_index(N, 2400, seed=3)
    x = torch.randn(N, D_IN, generator=torch.Generator().manual_seed(4))
    ids = torch.randperm(N, generator=torch.Generator().manual_seed(5)) * 7 + 1000
    folder = tmp_path_factory.mktemp("graph") / "g"
    store = GraphStore.from_edge_index(edge_index, x, node_ids=ids, reorder="rcmk")
    store.save(folder)
    return edge_index, x, ids, folder


def forward(family: str, edge_index: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return build(family, D_IN)(x, edge_index)


def by_external_id(want: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows of ``want`` (row i = external ID ids[i]) in ascending external ID."""
    return want[torch.argsort(ids)]


@pytest.fixture(scope="module")
def four_ranks(graph, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, _, _, folder = graph
    root = tmp_path_factory.mktemp("four")
    run_ranks(4, embed_families, str(folder), D_IN, FAMILIES, str(root))
    return root


@pytest.mark.parametrize("family", FAMILIES)
def test_four_gloo_ranks_equal_single_process(graph, four_ranks: Path, family: str) -> None:
    edge_index, x, ids, folder = graph
    got_ids, got, meta = read_embeddings(four_ranks / family / "out")
    want = by_external_id(forward(family, edge_index, x), ids)
    np.testing.assert_array_equal(got_ids, np.sort(ids.numpy()))
    assert_exact(torch.from_numpy(got), want, f"{family}: 4 ranks vs forward")
    store = GraphStore.open(folder)
    ev = LayerwiseEvaluator(build(family, D_IN), store, progress=False)
    assert_exact(torch.from_numpy(got), ev.evaluate(), f"{family}: 4 ranks vs evaluate()")
    assert meta["hopserve.world_size"] == "4"
    assert meta["hopserve.graph_version"] == store.version
    reports = [json.loads((four_ranks / family / f"report-{r}.json").read_text()) for r in range(4)]
    for report in reports:  # every rank received halo rows (the partition cut edges)
        assert sum(layer["halo_rows_received"] for layer in report["layers"]) > 0
    shards = sorted((four_ranks / family / "out").glob("part-*-of-00004.parquet"))
    assert len(shards) == 4
    ranges = [pq.read_schema(s).metadata[b"hopserve.storage_range"].decode() for s in shards]
    bounds = [tuple(map(int, r.split(":"))) for r in ranges]
    assert bounds[0][0] == 0 and bounds[-1][1] == N
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


def test_checkpoints_per_rank_and_layer(four_ranks: Path) -> None:
    manifest = json.loads((four_ranks / "jk_cat/ckpt/rank-00002/manifest.json").read_text())
    assert manifest["identity"]["world_size"] == 4
    assert manifest["completed_block"] == 3  # blocks 0..3 of the JK model
    # The residual value of block 1 is read again by block 3: it was checkpointed.
    assert "add" in manifest["values"]


def test_single_process_resume_and_refusal(graph, tmp_path: Path) -> None:
    edge_index, x, ids, folder = graph
    store = GraphStore.open(folder)
    model = build("jk_cat", D_IN)
    first = embed_all(model, store, tmp_path / "out", checkpoint_dir=tmp_path / "ck")
    assert first.resumed_after is None and all(r.computed for r in first.layers)
    _, got, _ = read_embeddings(tmp_path / "out")
    want = by_external_id(forward("jk_cat", edge_index, x), ids)
    assert_exact(torch.from_numpy(got), want, "jk_cat: one process")

    again = embed_all(model, store, tmp_path / "out", checkpoint_dir=tmp_path / "ck")
    assert again.resumed_after == 3 and not any(r.computed for r in again.layers)
    _, got_again, _ = read_embeddings(tmp_path / "out")
    np.testing.assert_array_equal(got_again, got)

    other = JobIdentity.of(model, store, version="2")
    with pytest.raises(CheckpointMismatchError, match=r"model_version '1' \(this job: '2'\)"):
        embed_all(model, store, tmp_path / "out2", checkpoint_dir=tmp_path / "ck", identity=other)
    retrained = build("jk_cat", D_IN, seed=1)
    with pytest.raises(CheckpointMismatchError, match="model_fingerprint"):
        embed_all(retrained, store, tmp_path / "out2", checkpoint_dir=tmp_path / "ck")


def test_rank_killed_mid_job_resumes(graph, tmp_path: Path) -> None:
    """Rank 2 dies after block 1 (checkpointed, halo exchanged); the restarted job loads
    block 1 on every rank instead of computing it and ends with the forward's rows."""
    edge_index, x, ids, folder = graph
    crash = {"HOPSERVE_EMBED_ALL_CRASH": "2:1"}
    with pytest.raises((ProcessExitedException, ProcessRaisedException)):
        run_ranks(4, embed_families, str(folder), D_IN, ["sage_mean"], str(tmp_path), env=crash)
    ckpt, out = tmp_path / "sage_mean" / "ckpt", tmp_path / "sage_mean" / "out"
    assert not (out / SUCCESS).exists()
    manifest = json.loads((ckpt / "rank-00002" / "manifest.json").read_text())
    assert manifest["completed_block"] == 1
    block1 = {p: p.stat().st_mtime_ns for p in ckpt.glob("rank-*/block-1.*.npy")}
    assert len(block1) == 4  # every rank had checkpointed block 1

    run_ranks(4, embed_families, str(folder), D_IN, ["sage_mean"], str(tmp_path))
    assert {p: p.stat().st_mtime_ns for p in block1} == block1  # loaded, not recomputed
    for rank in range(4):
        report = json.loads((tmp_path / "sage_mean" / f"report-{rank}.json").read_text())
        assert report["resumed_after"] == 1
        assert [r["computed"] for r in report["layers"]] == [False, True, True]
    _, got, _ = read_embeddings(out)
    want = by_external_id(forward("sage_mean", edge_index, x), ids)
    assert_exact(torch.from_numpy(got), want, "sage_mean: 4 ranks, resumed")
