"""The front-end needs no torch: with remote workers it plans, batches and answers without it.

A real ``hopserve serve`` process whose interpreter cannot import torch (``sys.modules``
blocks it), a real remote worker (this process), real gRPC; the answers equal the engine's,
and ``GetModel`` answers what an in-process front-end answers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from support.processes import child_env, start_serve, write_config

from hopserve.client import EmbeddingClient
from hopserve.testing import free_port

NO_TORCH = (
    "import sys\n"
    "for name in ('torch', 'torch_geometric', 'dgl'):\n"
    "    sys.modules[name] = None  # any import of them raises ImportError\n"
    "from hopserve.cli import main\n"
    "sys.argv = ['hopserve', *sys.argv[1:]]\n"
    "main()\n"
)


def test_a_front_end_without_torch_serves_through_a_remote_worker(
    make_config, start_server, evaluator, all_ids, tmp_path: Path
) -> None:
    from hopserve.worker.runtime import make_worker
    from hopserve.worker.service import serve_worker

    in_process = start_server(make_config(cache={"backend": "none"}))
    worker = make_worker("cpu")
    worker.load_model(in_process.service.config.models[0], in_process.service.config.engine)
    worker_server, worker_port = serve_worker(worker, "127.0.0.1", 0)
    config = make_config(cache={"backend": "none"}, workers=[f"127.0.0.1:{worker_port}"])
    proc = start_serve(
        config,
        tmp_path / "frontend.yaml",
        ("-c", NO_TORCH),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        target = f"127.0.0.1:{config.server.port}"
        with EmbeddingClient(target, timeout=60) as client:
            client.wait_until_ready(60, model="sage")
            ids = all_ids[[5, 250, 5, 17]]
            got = client.get_embeddings("sage", ids)
            np.testing.assert_allclose(got, evaluator.evaluate(ids).numpy(), atol=1e-5, rtol=1e-4)
            sampled = client.get_embeddings("sage", ids, fanouts=[2, 2, 2], seed=3)
            want = evaluator.evaluate(ids, fanouts=[2, 2, 2], seed=3).numpy()
            np.testing.assert_allclose(sampled, want, atol=1e-5, rtol=1e-4)
            remote_info = client.get_model("sage")
        with in_process.client() as client:
            local_info = client.get_model("sage")
        # GetModel is the same whether the worker is in the process or behind gRPC
        assert remote_info == local_info
        assert [b.kind for b in remote_info.blocks] == ["SAGEConv"] * 3
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        worker_server.stop(0)
        worker.close()
    assert proc.returncode == 0, err[-3000:]
    assert "ModuleNotFoundError" not in err and "ImportError" not in err, err[-3000:]


def test_front_end_modules_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import hopserve.server.app, hopserve.server.edge, hopserve.server.pipeline\n"
        "import hopserve.worker.graph.planner, hopserve.worker.graph.topology\n"
        "import hopserve.cli.serve, hopserve.cli.security, hopserve.security.factory\n"
        "bad = [m for m in ('torch', 'torch_geometric', 'dgl') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_embedded_worker_without_torch_is_a_clear_config_error(tmp_path: Path, make_config):
    config = make_config(cache={"backend": "none"}, port=free_port())
    path = write_config(config, tmp_path / "embedded.yaml")
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "torch" in proc.stderr and "server.workers" in proc.stderr
