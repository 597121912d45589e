"""``hopserve models`` against a real front-end, and ``hopserve serve`` reloading its
config file's models on SIGHUP.

The commands run through Typer's runner against a :class:`ServiceThread` (real worker,
engine and gRPC); the SIGHUP test runs ``hopserve serve`` as a process, as a user does.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from support.model_versions import MODEL, ServiceThread, Versions, write_versions
from support.processes import start_serve
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.client import EmbeddingClient


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    return write_versions(tmp_path_factory.mktemp("versions"), {"1": 1, "2": 2, "3": 3})


@pytest.fixture
def server(versions: Versions) -> Iterator[ServiceThread]:
    running = ServiceThread(versions.config(["1"]))
    yield running
    running.stop()


@pytest.fixture
def cli(server: ServiceThread):  # noqa: ANN201
    runner = CliRunner()

    def invoke(*args: str):  # noqa: ANN202
        return runner.invoke(app, ["models", *args, "--target", server.target])

    return invoke


def listed(cli) -> dict[str, dict]:  # noqa: ANN001
    result = cli("list", "--format", "json")
    assert result.exit_code == 0, result.output
    return {m["version"]: m for m in json.loads(result.stdout)}


def test_list_table(cli) -> None:  # noqa: ANN001
    result = cli("list")
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()
    assert header.split() == ["model", "version", "state", "default", "traffic", "dim",
                              "layers", "graph"]  # fmt: skip
    assert row.split()[:7] == [MODEL, "1", "ready", "*", "100%", "4", "2"]


def test_load_default_replace(
    cli, server: ServiceThread, versions: Versions, tmp_path: Path
) -> None:  # noqa: ANN001
    entry = tmp_path / "v2.yaml"
    entry.write_text(yaml.safe_dump(versions.entry("2")))
    result = cli("load", "--file", str(entry), "--default", "--replace", "--format", "json")
    assert result.exit_code == 0, result.output
    (info,) = json.loads(result.stdout)
    assert (info["version"], info["state"], info["is_default"]) == ("2", "ready", True)
    assert "unloaded tiny:1 (0 requests drained)" in result.stderr
    assert set(listed(cli)) == {"2"}
    ids = versions.external_ids[:5]
    with server.client() as client:
        res = client.get_embeddings_with_info(MODEL, ids)
    assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)


def test_load_beside_canary_unload(cli, versions: Versions) -> None:  # noqa: ANN001
    result = cli("load", "--entry", json.dumps(versions.entry("3")))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].split()[:5] == [MODEL, "3", "ready", "0%", "4"]
    result = cli("default", "-m", MODEL, "-V", "1", "--canary", "3", "--canary-percent", "10")
    assert result.exit_code == 0, result.output
    shares = {v: m["traffic_percent"] for v, m in listed(cli).items()}
    assert shares == {"1": 90, "3": 10}
    result = cli("unload", "-m", MODEL, "-V", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "unloaded tiny:3 (0 requests drained)"
    assert set(listed(cli)) == {"1"}


def test_errors(cli, versions: Versions, tmp_path: Path) -> None:  # noqa: ANN001
    result = cli("unload", "-m", MODEL, "-V", "1")  # the last version: allowed...
    assert result.exit_code == 0
    result = cli("unload", "-m", MODEL, "-V", "1")  # ...once
    assert result.exit_code == 1
    assert result.stderr.startswith("error: [NOT_FOUND] UnloadModel: model 'tiny' not found")
    result = cli("load", "--entry", "name: tiny\nentrypoint: m:C\ngraph: /nope\nweights: /x.pt")
    assert (
        result.exit_code == 1
        and "[INVALID_ARGUMENT] LoadModel: config.weights: file not found" in result.stderr
    )
    result = cli("load")
    assert result.exit_code == 2 and "exactly one of --file and --entry" in result.output
    result = cli("load", "--entry", "x: 1", "--replace")
    assert result.exit_code == 2 and "--replace needs --default" in result.output
    result = cli("default", "-m", MODEL, "-V", "1", "--canary-percent", "5")
    assert result.exit_code == 1 and "go together" in result.stderr


def test_serve_reloads_models_on_sighup(versions: Versions, tmp_path: Path) -> None:
    """Rewrite the file (version 2 default, 1 gone), SIGHUP: served without a restart;
    a file that does not validate changes nothing."""
    config = versions.config(["1"])
    path = tmp_path / "hopserve.yaml"
    proc = start_serve(config, path, stderr=open(tmp_path / "serve.log", "w"))  # noqa: SIM115
    target = f"127.0.0.1:{config.server.port}"
    ids = versions.external_ids[10:20]
    try:
        with EmbeddingClient(target, timeout=60) as client:
            client.wait_until_ready(120, model=MODEL)
            assert client.get_embeddings_with_info(MODEL, ids).model_version == "1"
            data = yaml.safe_load(path.read_text())
            data["models"] = [versions.entry("2", default=True), versions.entry("3")]
            path.write_text(yaml.safe_dump(data))
            proc.send_signal(signal.SIGHUP)
            _until(lambda: {m.version for m in client.list_models()} == {"2", "3"}, 120)
            served = {m.version: m.is_default for m in client.list_models()}
            assert served == {"2": True, "3": False}
            res = client.get_embeddings_with_info(MODEL, ids)
            assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)
            path.write_text("models: [{name: tiny}]\n")  # invalid: nothing changes
            proc.send_signal(signal.SIGHUP)
            time.sleep(1.0)
            assert {m.version for m in client.list_models()} == {"2", "3"}
            assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
    log = (tmp_path / "serve.log").read_text()
    assert "not reloaded, nothing changed" in log and "models[0].entrypoint" in log
    assert np.isfinite(res.embeddings).all()


def _until(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")
