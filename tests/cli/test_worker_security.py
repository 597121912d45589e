"""``hopserve worker`` and ``hopserve serve`` as processes with security configured:
the worker serves mutual TLS on loopback by default, both survive SIGHUP (token reload)
and say their posture; a front-end process with the link credentials serves through it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from support.pki import READ_TOKEN, write_pki, write_tokens
from support.processes import child_env, run_hopserve
from support.servable import write_servable

from hopserve.client import EmbeddingClient
from hopserve.testing import free_port, wait_for_port


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hopserve", *args], env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.terminate()
    _, err = proc.communicate(timeout=30)
    return err


def test_secured_worker_and_front_end_processes(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "secrets")
    (tmp_path / "secrets" / "link.token").write_text("hs_link_process_0123456789abcdef\n")
    servable = write_servable(tmp_path / "servable")
    worker_port, port = free_port(), free_port()
    model = {"name": "tiny", "entrypoint": "support.servable:TinySAGE",
             "kwargs": servable.kwargs, "weights": str(servable.weights),
             "graph": str(servable.graph_dir)}  # fmt: skip
    link = {"ca_file": "secrets/ca.crt", "token_file": "secrets/link.token"}
    worker_cfg = {
        "models": [model],
        "security": {"link": link | {"cert_file": "secrets/server.crt",
                                     "key_file": "secrets/server.key"}},
    }  # fmt: skip
    front_cfg = {
        "models": [model],
        "server": {"port": port, "metrics_port": 0, "workers": [f"localhost:{worker_port}"]},
        "cache": {"backend": "none"},
        "security": {"tokens_file": "secrets/tokens.yaml",
                     "link": link | {"cert_file": "secrets/client.crt",
                                     "key_file": "secrets/client.key"}},
    }  # fmt: skip
    write_tokens(tmp_path / "secrets" / "tokens.yaml")
    (tmp_path / "worker.yaml").write_text(yaml.safe_dump(worker_cfg))
    (tmp_path / "front.yaml").write_text(yaml.safe_dump(front_cfg))
    worker = _start("worker", "-c", str(tmp_path / "worker.yaml"), "--port", str(worker_port))
    front = None
    try:
        wait_for_port(worker_port, 120, worker)
        probe = ("health", "--target", f"127.0.0.1:{worker_port}", "--service",
                 "hopserve.v1.WorkerService", "--root-certs", str(pki.ca))  # fmt: skip
        mtls = ("--client-cert", str(pki.client_cert), "--client-key", str(pki.client_key))
        assert run_hopserve(*probe, *mtls).returncode == 0
        assert run_hopserve(*probe, "--timeout", "2").returncode == 1  # no client certificate
        worker.send_signal(signal.SIGHUP)  # reload the link token, do not die
        time.sleep(0.5)
        assert worker.poll() is None
        front = _start("serve", "-c", str(tmp_path / "front.yaml"))
        with EmbeddingClient(f"127.0.0.1:{port}", timeout=60, token=READ_TOKEN) as client:
            client.wait_until_ready(60, model="tiny")
            front.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            assert client.get_embeddings("tiny", [7, 17, 27]).shape == (3, 4)  # id = 10 i + 7
        assert front.poll() is None
    finally:
        front_err = _stop(front) if front is not None else ""
        worker_err = _stop(worker)
    assert "security: worker port on 127.0.0.1: mutual TLS, link token required" in worker_err
    assert "listening on 127.0.0.1:" in worker_err
    assert "warning" not in worker_err.lower(), worker_err[-2000:]
    assert "to workers: mutual TLS + token" in front_err, front_err[-2000:]
