"""The worker port behind mutual TLS and the link token: only a front-end holding both
runs jobs (real certificates, real channels, the front-end's own RemoteWorkerClient)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.pki import LINK_TOKEN, write_pki
from support.servable import exact_job, write_servable

from hopserve.config.security import LinkConfig
from hopserve.proto.contract import JobError, WorkerUnavailableError
from hopserve.security.factory import link_channel, worker_credentials, worker_gate
from hopserve.security.tls import channel_credentials
from hopserve.server.worker_clients import RemoteWorkerClient
from hopserve.worker.runtime import make_worker
from hopserve.worker.service import serve_worker


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    folder = tmp_path_factory.mktemp("link")
    pki = write_pki(folder)
    (folder / "link.token").write_text(LINK_TOKEN + "\n")
    worker_side = LinkConfig(ca_file=pki.ca, cert_file=pki.server_cert, key_file=pki.server_key,
                             token_file=folder / "link.token")  # fmt: skip
    front_side = LinkConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key,
                            token_file=folder / "link.token")  # fmt: skip
    servable = write_servable(folder / "servable")
    worker = make_worker("cpu", worker_id="secure-worker")
    worker.load_model(servable.config())
    server, port = serve_worker(
        worker, "127.0.0.1", 0,
        credentials=worker_credentials(worker_side), gate=worker_gate(worker_side),
    )  # fmt: skip
    yield {"servable": servable, "worker": worker, "address": f"localhost:{port}",
           "front": front_side, "pki": pki, "folder": folder}  # fmt: skip
    server.stop(None).wait(5)
    worker.close()


def _run(address: str, job, **client) -> object:  # noqa: ANN001, ANN003
    async def go():
        remote = RemoteWorkerClient(address, timeout_s=10, status_timeout_s=5, **client)
        try:
            return await remote.run(job), await remote.status()
        finally:
            await remote.close()

    return asyncio.run(go())


def _job(linked: dict):
    return exact_job(linked["servable"].store, [1, 30, 99], deadline=time.time() + 30)


def test_the_front_end_with_the_link_credentials_runs_jobs(linked: dict) -> None:
    link = link_channel(linked["front"])
    job = _job(linked)
    result, status = _run(linked["address"], job, credentials=link.credentials,
                          metadata=link.metadata)  # fmt: skip
    np.testing.assert_array_equal(result.embeddings, linked["worker"].execute(job).embeddings)
    assert status.worker_id == "secure-worker"


def test_without_the_link_credentials_no_job_runs(linked: dict, tmp_path: Path) -> None:
    pki, job = linked["pki"], _job(linked)
    token = (("authorization", f"Bearer {LINK_TOKEN}"),)
    other = write_pki(tmp_path, "rogue-")
    cases = {
        "plaintext": ({}, WorkerUnavailableError, None),
        "server TLS only, no client certificate": (
            {"credentials": channel_credentials(pki.ca), "metadata": lambda: token},
            WorkerUnavailableError, None,
        ),
        "a client certificate from another CA": (
            {"credentials": channel_credentials(pki.ca, other.client_cert, other.client_key),
             "metadata": lambda: token},
            WorkerUnavailableError, None,
        ),
        "mutual TLS without the token": (
            {"credentials": channel_credentials(pki.ca, pki.client_cert, pki.client_key)},
            JobError, "needs a token with scope 'worker'",
        ),
        "mutual TLS with a wrong token": (
            {"credentials": channel_credentials(pki.ca, pki.client_cert, pki.client_key),
             "metadata": lambda: (("authorization", "Bearer hs_guess_0123456789abcdef"),)},
            JobError, "not valid",
        ),
    }  # fmt: skip
    for name, (client, error, text) in cases.items():
        with pytest.raises(error, match=text) as info:
            _run(linked["address"], job, **client)
        assert LINK_TOKEN not in str(info.value), name
        if error is JobError:
            assert not isinstance(info.value, WorkerUnavailableError), name


def test_the_front_ends_link_certificate_rotates_without_restart(
    linked: dict, tmp_path: Path
) -> None:
    """The front-end starts with a client certificate the worker does not trust; once the
    files hold one it does, the same client gets through (a new channel), no restart."""
    rogue = write_pki(tmp_path, "rogue-")
    cert, key = tmp_path / "link.crt", tmp_path / "link.key"
    cert.write_bytes(rogue.client_cert.read_bytes())
    key.write_bytes(rogue.client_key.read_bytes())
    link = link_channel(linked["front"].model_copy(update={"cert_file": cert, "key_file": key}))
    job = _job(linked)

    async def go():
        remote = RemoteWorkerClient(linked["address"], timeout_s=10, status_timeout_s=5,
                                    credentials=link.credentials, metadata=link.metadata)  # fmt: skip
        try:
            with pytest.raises(WorkerUnavailableError):
                await remote.status()
            for src, dst in ((linked["pki"].client_key, key), (linked["pki"].client_cert, cert)):
                dst.with_suffix(".tmp").write_bytes(src.read_bytes())
                os.replace(dst.with_suffix(".tmp"), dst)
                st = dst.stat()
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
            await asyncio.sleep(1.2)  # the credentials are checked at most once a second
            return await remote.status(), await remote.run(job)
        finally:
            await remote.close()

    status, result = asyncio.run(go())
    assert status.worker_id == "secure-worker"
    np.testing.assert_array_equal(result.embeddings, linked["worker"].execute(job).embeddings)
