"""examples/recommender.py runs as written: typed requests are exact and listed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "recommender.py"


def test_recommender_walkthrough_serves_a_users_candidates_exactly(capsys) -> None:
    spec = importlib.util.spec_from_file_location("recommender", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(["--users", "600", "--train-seconds", "0.5"])
    assert [name for name, _ in out["node_types"]] == ["user", "item", "category"]
    assert len(out["relations"]) == 6
    assert out["item_error"] < 1e-4 and out["user_error"] < 1e-4
    assert sorted(out["ranked"]) == sorted(set(out["ranked"])) and len(out["ranked"]) == 12
    assert "candidates, best first" in capsys.readouterr().out
