"""examples/fraud_scoring.py runs as written: what-if rows and written rows are exact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fraud_scoring.py"


def test_fraud_walkthrough_scores_without_writing_then_reads_its_write(capsys) -> None:
    spec = importlib.util.spec_from_file_location("fraud_scoring", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(["--accounts", "1000", "--train-seconds", "0.5"])
    assert out["what_if_seq"] == 0 and out["written_seq"] == 1 and out["after_seq"] == 1
    assert out["what_if_error"] < 1e-4 and out["after_error"] < 1e-4
    assert [f.frontier_sizes[-1] for f in out["footprints"]] == [1, 1]
    assert "nothing written" in capsys.readouterr().out
