"""Layer checkpoints: round trip, atomic files, and refusal of another job's directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hopserve.worker.distributed.checkpoint import CheckpointMismatchError, RankCheckpoint

IDENTITY = {"model_name": "sage", "model_version": "1", "graph_version": "abc", "rows": [0, 4]}


def test_round_trip_and_resume_point(tmp_path: Path) -> None:
    ck = RankCheckpoint(tmp_path, 3, IDENTITY)
    assert ck.completed() == -1
    h1 = torch.randn(4, 5)
    ck.save(0, 1, {"h1": h1})
    ck.save(1, 2, {"h2": torch.randn(4, 2).to(torch.bfloat16)})
    again = RankCheckpoint(tmp_path, 3, IDENTITY)
    assert again.completed() == 1
    assert torch.equal(again.load("h1"), h1) and again.block_of("h1") == 1
    assert again.load("h2").dtype == torch.bfloat16
    # Only final names: every temporary file was renamed.
    names = sorted(p.name for p in (tmp_path / "rank-00003").iterdir())
    assert names == ["block-1.h1.npy", "block-2.h2.npy", "manifest.json"]


def test_another_jobs_checkpoint_is_refused(tmp_path: Path) -> None:
    RankCheckpoint(tmp_path, 0, IDENTITY).save(0, 1, {"h1": torch.zeros(4, 2)})
    other = RankCheckpoint(tmp_path, 0, IDENTITY | {"graph_version": "def"})
    with pytest.raises(CheckpointMismatchError, match=r"graph_version 'abc' \(this job: 'def'\)"):
        other.completed()


def test_corrupt_manifest_is_refused(tmp_path: Path) -> None:
    ck = RankCheckpoint(tmp_path, 0, IDENTITY)
    ck.save(0, 1, {"h1": torch.zeros(4, 2)})
    manifest = tmp_path / "rank-00000" / "manifest.json"
    manifest.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CheckpointMismatchError, match="not a hopserve-embed-all-checkpoint"):
        RankCheckpoint(tmp_path, 0, IDENTITY).completed()
    manifest.write_text("{")
    with pytest.raises(CheckpointMismatchError, match="unreadable"):
        RankCheckpoint(tmp_path, 0, IDENTITY).completed()
