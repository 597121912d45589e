"""``hopserve serve``: start-up reporting and ``--check``, tried as a new user would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.processes import run_hopserve as hopserve
from support.servable import Servable, write_servable

from hopserve.testing import free_port

TESTS = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def servable(tmp_path_factory: pytest.TempPathFactory) -> Servable:
    return write_servable(tmp_path_factory.mktemp("servable"))


def write_config(folder: Path, servable: Servable, *bad: dict) -> Path:
    """A config in ``folder`` with model ``good`` and one broken model per ``bad`` entry."""
    good = {
        "name": "good",
        "entrypoint": "support.servable:TinySAGE",
        "kwargs": servable.kwargs,
        "weights": str(servable.weights),
        "graph": str(servable.graph_dir),
    }
    models = [good] + [good | {"name": f"bad{i}"} | b for i, b in enumerate(bad)]
    config = {
        "models": models,
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0},
        "cache": {"backend": "memory"},
    }
    path = folder / "hopserve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


BROKEN = (
    {"entrypoint": "support.servable:NotAModel"},
    {"kwargs": {"in_dim": 999, "hidden": 8, "out_dim": 4}},
    {"entrypoint": "support.servable:TinyAPPNP", "weights": None},
    {"entrypoint": "support.servable:MixesNodes"},
)


def test_check_reports_every_model_one_line_each(tmp_path: Path, servable: Servable) -> None:
    config = write_config(tmp_path, servable, *BROKEN)
    proc = hopserve("serve", "--config", str(config), "--check")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert any(
        line.startswith("ok: model 'good' version '1': layerwise, 2 layers") for line in lines
    )
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 4, proc.stderr  # every failing model, not only the first
    assert "bad0" in errors[0] and "not a torch.nn.Module subclass" in errors[0]
    assert "bad1" in errors[1] and "do not match" in errors[1]
    assert "bad2" in errors[2] and "`fallback: nodewise` in the model's config" in errors[2]
    assert "bad3" in errors[3] and errors[3].endswith("(more with -v)")  # a multi-line reason
    assert "serving" not in proc.stderr
    full = hopserve("-v", "serve", "--config", str(config), "--check")
    assert full.returncode == 2 and "(more with -v)" not in full.stderr
    assert "Schema:" in full.stderr  # the rest of bad3's reason


def test_check_passes_a_servable_config(tmp_path: Path, servable: Servable) -> None:
    config = write_config(
        tmp_path,
        servable,
        {"entrypoint": "support.servable:TinyAPPNP", "weights": None, "fallback": "nodewise"},
    )
    proc = hopserve("serve", "--config", str(config), "--check")
    assert proc.returncode == 0, proc.stderr
    assert "ok: model 'bad0' version '1': nodewise" in proc.stderr


def test_serve_says_serving_only_when_every_model_is_ready(
    tmp_path: Path, servable: Servable
) -> None:
    """Regression: 'serving' was printed before the models loaded, and only the first
    failing model was reported."""
    config = write_config(tmp_path, servable, *BROKEN[:2])
    proc = hopserve("serve", "--config", str(config))
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert [("bad0" in errors[0]), ("bad1" in errors[1])] == [True, True], proc.stderr
    assert "hopserve serving" not in proc.stderr
