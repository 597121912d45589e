"""A front-end and a remote worker over the secured link (mutual TLS + link token): with
the link credentials the rows are exact; without them the worker runs nothing, the model
never turns ready and the front-end says why."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from support.e2e import expected
from support.logs import capture_records
from support.pki import LINK_TOKEN, write_pki

from hopserve.client import UnavailableError
from hopserve.config.security import LinkConfig, SecurityConfig
from hopserve.security.factory import worker_credentials, worker_gate
from hopserve.worker.runtime import make_worker
from hopserve.worker.service import serve_worker

MODEL = "sage"


@pytest.fixture(scope="module")
def secure_worker(make_config, tmp_path_factory) -> Iterator[dict]:  # noqa: ANN001
    folder = tmp_path_factory.mktemp("link")
    pki = write_pki(folder)
    (folder / "link.token").write_text(LINK_TOKEN)
    config = make_config(cache={"backend": "none"})
    worker = make_worker("cpu")
    worker.load_model(config.models[0], config.engine)
    link = LinkConfig(ca_file=pki.ca, cert_file=pki.server_cert, key_file=pki.server_key,
                      token_file=folder / "link.token")  # fmt: skip
    server, port = serve_worker(worker, "127.0.0.1", 0, credentials=worker_credentials(link),
                                gate=worker_gate(link))  # fmt: skip
    front = LinkConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key,
                       token_file=folder / "link.token", server_name="localhost")  # fmt: skip
    yield {"address": f"127.0.0.1:{port}", "front": front}
    server.stop(None).wait(5)
    worker.close()


def _front_end(make_config, secure_worker: dict, link: LinkConfig | None):  # noqa: ANN001
    config = make_config(cache={"backend": "none"}, workers=[secure_worker["address"]])
    security = SecurityConfig() if link is None else SecurityConfig(link=link)
    return config.model_copy(update={"security": security})


def test_front_end_with_link_credentials_serves_exact_rows(
    make_config,
    start_server,
    secure_worker,
    evaluator,
    all_ids,  # noqa: ANN001
) -> None:
    server = start_server(_front_end(make_config, secure_worker, secure_worker["front"]))
    ids = all_ids[[4, 200, 4]]
    with server.client() as client:
        np.testing.assert_allclose(client.get_embeddings(MODEL, ids), expected(evaluator, ids),
                                   atol=1e-5, rtol=1e-4)  # fmt: skip
        assert [b.kind for b in client.get_model(MODEL).blocks] == ["SAGEConv"] * 3


@pytest.mark.parametrize("credentials", ["none", "mtls without token"])
def test_front_end_without_link_credentials_runs_nothing(
    make_config,
    start_server,
    secure_worker,
    all_ids,
    credentials: str,  # noqa: ANN001
) -> None:
    link = None if credentials == "none" else secure_worker["front"].model_copy(
        update={"token_file": None})  # fmt: skip
    with capture_records() as records:
        server = start_server(_front_end(make_config, secure_worker, link), expect_ready=None)
        if credentials != "none":  # wait for the worker's first refusal to be logged
            end = time.monotonic() + 20
            while not any("needs a token" in r.getMessage() for r in records.records):
                assert time.monotonic() < end, "no refusal logged"
                time.sleep(0.1)
        time.sleep(2.0)  # several more status polls (every 0.5 s while loading)
        assert server.service.models.get(MODEL).state == "loading"
        with server.client(max_retries=0, timeout=5) as client:
            assert not client.health(MODEL)
            with pytest.raises(UnavailableError):
                client.get_embeddings(MODEL, all_ids[:2])
    logged = [r.getMessage() for r in records.records]
    if credentials != "none":  # the worker answered: UNAUTHENTICATED, said once
        refused = [m for m in logged if "refused" in m and "needs a token" in m]
        assert len(refused) == 1, logged
    assert not any(LINK_TOKEN in m for m in logged)
