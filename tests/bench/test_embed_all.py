"""``bench/embed_all.py`` on a small graph, 1 and 2 torchrun ranks: the report is written,
the 2-rank shards equal the 1-rank ones (to float rounding), and the bytes exchanged equal
the halo lower bound the script counts independently of the job. Timings are reported, not
asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "embed_all.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_embed_all_bench_small(tmp_path: Path) -> None:
    cmd = [
        sys.executable, str(SCRIPT), "--nodes", "3000", "--avg-degree", "8", "--dim", "16",
        "--hidden", "32", "--out-dim", "8", "--worlds", "1,2", "--repeat", "1",
        "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "out" / "embed_all.json").read_text())
    two = summary["results"]["2"]
    assert two["max_abs_diff_vs_1_rank"] <= 1e-5  # different thread counts may round apart
    assert two["bytes_exchanged"] == two["bytes_lower_bound"] > 0
    assert [x["bytes_received"] > 0 for x in two["layers"]] == [True, True, False]
    assert summary["scaling_model"]["scenarios"]
    for name in ("embed_all.md", "embed_all.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
