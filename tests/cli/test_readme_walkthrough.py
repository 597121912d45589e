"""README's "Serve your PyG model in five minutes", run as written.

The model file and the config are taken from the README's own code blocks, written into
a fresh folder next to each other, and served with ``hopserve serve`` as a new user
would; the served rows must equal the model's own full-graph forward on the user's data.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hopserve.testing import free_port

pytest.importorskip("torch_geometric")

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Serve your PyG model in five minutes"


def readme_block(first_line: str) -> str:
    """The README code block of the walkthrough whose first line is ``first_line``."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    for block in re.findall(r"```\w*\n(.*?)```", section, flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"README walkthrough has no block starting {first_line!r}")


def hopserve(*args: str) -> list[str]:
    return [sys.executable, "-m", "hopserve", *args]


def test_walkthrough_serves_the_models_own_forward(tmp_path: Path) -> None:
    from torch_geometric.data import Data

    from hopserve import GraphStore
    from hopserve.client import EmbeddingClient

    folder = tmp_path / "my_project"
    folder.mkdir()
    (folder / "my_models.py").write_text(readme_block("# my_models.py"))
    config = yaml.safe_load(readme_block("# hopserve.yaml"))
    port = free_port()
    config["server"] |= {"host": "127.0.0.1", "port": port, "metrics_port": 0}
    (folder / "hopserve.yaml").write_text(yaml.safe_dump(config))

    # prepare.py, with a random graph and an untrained model standing in for the user's.
    kwargs = config["models"][0]["kwargs"]
    gen = torch.Generator().manual_seed(0)
    n = 300
    data = Data(
        x=torch.randn(n, kwargs["in_dim"], generator=gen),
        edge_index=torch.randint(0, n, (2, 2400), generator=gen),
    )
    sys.path.insert(0, str(folder))
    try:
        from my_models import SAGE  # the README's model, imported like the user does
    finally:
        sys.path.remove(str(folder))
    torch.manual_seed(0)
    model = SAGE(**kwargs).eval()
    GraphStore.from_pyg(data).save(folder / "graph")
    torch.save(model.state_dict(), folder / "sage.pt")
    with torch.no_grad():
        want = model(data.x, data.edge_index)

    # Run from another folder: paths and the entrypoint resolve next to the config.
    env = os.environ | {"PYTHONPATH": ""}
    check = subprocess.run(
        hopserve("serve", "--check", "-c", str(folder / "hopserve.yaml")),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    assert "ok: model 'sage'" in check.stderr

    server = subprocess.Popen(
        hopserve("serve", "-c", str(folder / "hopserve.yaml")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        ids = [3, 1, 4, 1, 299, 0]
        with EmbeddingClient(f"127.0.0.1:{port}", timeout=60) as client:
            client.wait_until_ready(120, model="sage")
            got = torch.from_numpy(client.get_embeddings("sage", ids))
        scale = float(want.abs().max())
        assert torch.allclose(got, want[ids], rtol=1e-5, atol=1e-6 * max(scale, 1.0))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            _, err = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            _, err = server.communicate()
    assert server.returncode == 0, err
