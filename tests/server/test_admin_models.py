"""Model versions on a running front-end, through AdminService and the real SDK.

Everything is real: graph store and weights on disk, the in-process worker and engine,
gRPC over loopback, the admin and embedding clients. Two versions of ``TinySAGE`` with
different weights serve the same graph; every answer is checked against its version's
own full-graph forward.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from support.model_versions import MODEL, ServiceThread, Versions, write_versions

from hopserve.client import HopserveError, InvalidArgumentError, NotFoundError
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    return write_versions(tmp_path_factory.mktemp("versions"), {"1": 1, "2": 2, "3": 3})


@pytest.fixture
def server(versions: Versions) -> Iterator[ServiceThread]:
    """A front-end serving version 1 only."""
    running = ServiceThread(versions.config(["1"]))
    yield running
    running.stop()


def ids_of(versions: Versions, n: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).choice(versions.external_ids, n, replace=False)


def states(server: ServiceThread) -> dict[str, tuple[str, bool, int]]:
    with server.client() as client:
        return {m.version: (m.state, m.is_default, m.traffic_percent) for m in client.list_models()}


def raw_admin(server: ServiceThread, method: str, request: object) -> grpc.RpcError:
    """Call ``method`` with the generated stub (no client-side checks); its error."""
    with grpc.insecure_channel(server.target) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub, method)(request, timeout=60)
    return info.value


def test_load_beside_switch_default_unload(server: ServiceThread, versions: Versions) -> None:
    ids = ids_of(versions)
    with server.admin() as admin, server.client() as client:
        info = admin.load_model(versions.entry("2"))
        assert (info.version, info.state, info.is_default, info.traffic_percent) == (
            "2", "ready", False, 0,
        )  # fmt: skip
        assert states(server) == {"1": ("ready", True, 100), "2": ("ready", False, 0)}
        assert server.health(f"{MODEL}:2") == "SERVING"
        assert server.sample("hopserve_model_ready", model=MODEL, version="2") == 1
        # beside: unversioned requests still get version 1, a named version gets itself
        res = client.get_embeddings_with_info(MODEL, ids)
        assert res.model_version == "1" and versions.matches("1", ids, res.embeddings)
        res = client.get_embeddings_with_info(MODEL, ids, model_version="2")
        assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)

        info = admin.set_default_model(MODEL, "2")
        assert (info.version, info.is_default, info.traffic_percent) == ("2", True, 100)
        res = client.get_embeddings_with_info(MODEL, ids)
        assert res.model_version == "2" and versions.matches("2", ids, res.embeddings)

        unloaded = admin.unload_model(MODEL, "1")
        assert (unloaded.version, unloaded.drained_requests) == ("1", 0)
        assert states(server) == {"2": ("ready", True, 100)}
        with pytest.raises(NotFoundError, match="version '1' not found"):
            client.get_embeddings(MODEL, ids, model_version="1")
    assert server.sample("hopserve_model_ready", model=MODEL, version="1") is None
    assert server.health(f"{MODEL}:1") == "NOT_SERVING"
    assert server.health(MODEL) == server.health("") == "SERVING"
    worker = next(iter(server.service._workers.local.values()))
    assert set(worker.models) == {(MODEL, "2")}  # unloaded from the worker too


def test_load_as_default_and_get_model(server: ServiceThread, versions: Versions) -> None:
    ids = ids_of(versions, seed=1)
    with server.admin() as admin, server.client() as client:
        yaml_entry = (
            "\n".join(f"{k}: {v}" for k, v in versions.entry("3").items() if k != "kwargs")
            + f"\nkwargs: {versions.kwargs}"
        )
        info = admin.load_model(yaml_entry, make_default=True)
        assert (info.version, info.is_default, info.dim, info.num_layers) == ("3", True, 4, 2)
        assert client.get_model(MODEL).version == "3"  # empty version: the default
        assert client.get_model(MODEL, version="1").state == "ready"
        res = client.get_embeddings_with_info(MODEL, ids)
        assert res.model_version == "3" and versions.matches("3", ids, res.embeddings)


def test_canary_gets_its_exact_share(server: ServiceThread, versions: Versions) -> None:
    ids = ids_of(versions, n=4, seed=2)
    with server.admin() as admin, server.client() as client:
        admin.load_model(versions.entry("2"))
        info = admin.set_default_model(MODEL, "1", canary_version="2", canary_percent=25)
        assert (info.version, info.traffic_percent) == ("1", 75)
        assert states(server) == {"1": ("ready", True, 75), "2": ("ready", False, 25)}
        seen = {"1": 0, "2": 0}
        for _ in range(100):
            res = client.get_embeddings_with_info(MODEL, ids, cache_policy="bypass")
            assert versions.matches(res.model_version, ids, res.embeddings)
            seen[res.model_version] += 1
        assert seen == {"1": 75, "2": 25}
        # the canary cannot be unloaded while... it can: its share returns to the default
        assert admin.unload_model(MODEL, "2").version == "2"
        assert states(server) == {"1": ("ready", True, 100)}


def test_unload_drains_requests_in_flight(server: ServiceThread, versions: Versions) -> None:
    """Requests resolved to version 1 before its unload are answered by version 1."""
    ids = ids_of(versions, n=6, seed=3)
    worker = next(iter(server.service._workers.local.values()))
    with server.admin() as admin:
        admin.load_model(versions.entry("2"))
        with server.client() as client:  # cached: answered while the device is blocked
            client.get_embeddings(MODEL, ids, model_version="2")
        lock = worker.model(MODEL, "1").lock
        lock.acquire()  # version 1's jobs wait: its requests stay in flight
        try:
            with ThreadPoolExecutor(6) as pool:
                pending = [
                    pool.submit(
                        lambda: server.client().get_embeddings_with_info(
                            MODEL, ids, cache_policy="bypass"
                        )
                    )
                    for _ in range(4)
                ]
                model = server.service.models.find(MODEL, "1")
                _wait(lambda: model.inflight == 4)
                admin.set_default_model(MODEL, "2")
                unload = pool.submit(admin.unload_model, MODEL, "1")
                _wait(lambda: model.state == "draining")
                assert states(server)["1"][0] == "draining"
                with server.client() as client:  # new requests: version 2 at once
                    res = client.get_embeddings_with_info(MODEL, ids)
                    assert res.model_version == "2" and res.cache_hits == len(ids)
                    with pytest.raises(NotFoundError, match="being unloaded"):
                        client.get_embeddings(MODEL, ids, model_version="1")
                assert not unload.done()
                lock.release()
                results = [f.result(30) for f in pending]
                assert unload.result(30).drained_requests == 4
        finally:
            if lock.locked():
                lock.release()
    for res in results:
        assert res.model_version == "1" and versions.matches("1", ids, res.embeddings)
    assert set(states(server)) == {"2"}


def test_lifecycle_errors_name_the_bad_value(server: ServiceThread, versions: Versions) -> None:
    with server.admin() as admin:
        with pytest.raises(HopserveError, match="already loaded") as err:
            admin.load_model(versions.entry("1"))
        assert err.value.code is grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(InvalidArgumentError, match="config: bogus: unknown key"):
            admin.load_model(versions.entry("2", version="4", bogus=1))
        with pytest.raises(InvalidArgumentError, match="YAML syntax error"):
            admin.load_model("name: [x\n")
        with pytest.raises(
            InvalidArgumentError, match=r"config.weights: file not found .got '/nope/w.pt'."
        ):
            admin.load_model(versions.entry("2", version="4", weights="/nope/w.pt"))
        other = versions.root / "other-graph"
        other.mkdir(exist_ok=True)
        with pytest.raises(InvalidArgumentError, match="not a graph this server serves"):
            admin.load_model(versions.entry("2", version="4", graph=str(other)))
        with pytest.raises(NotFoundError, match="model 'nope' not found"):
            admin.unload_model("nope", "1")
        with pytest.raises(NotFoundError, match="version '9' not found"):
            admin.set_default_model(MODEL, "9")
        admin.load_model(versions.entry("2"))
        with pytest.raises(HopserveError, match="is the default; make another") as err:
            admin.unload_model(MODEL, "1")
        assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    # what the server checks itself (the client refuses these before sending)
    error = raw_admin(
        server,
        "SetDefaultModel",
        admin_pb2.SetDefaultModelRequest(name=MODEL, version="1", canary_version="2",
                                         canary_percent=150),
    )  # fmt: skip
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "150" in error.details()
    error = raw_admin(server, "UnloadModel", admin_pb2.UnloadModelRequest(name=MODEL))
    assert (
        error.code() is grpc.StatusCode.INVALID_ARGUMENT and "version is empty" in error.details()
    )
    error = raw_admin(server, "LoadModel", admin_pb2.LoadModelRequest(config="[1, 2]"))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "got list" in error.details()
    assert states(server) == {"1": ("ready", True, 100), "2": ("ready", False, 0)}


def test_failed_load_leaves_served_versions_alone(
    server: ServiceThread, versions: Versions
) -> None:
    ids = ids_of(versions, seed=4)
    with server.admin() as admin, server.client() as client:
        bad = versions.entry(
            "2", version="5", kwargs={**versions.kwargs, "hidden": 3}
        )  # weights don't fit
        with pytest.raises(InvalidArgumentError, match="version '5'"):
            admin.load_model(bad, make_default=True)
        assert states(server) == {"1": ("ready", True, 100)}
        assert server.sample("hopserve_model_ready", model=MODEL, version="5") is None
        res = client.get_embeddings_with_info(MODEL, ids)
        assert res.model_version == "1" and versions.matches("1", ids, res.embeddings)
        # the same version loads once its entry is right
        assert admin.load_model(versions.entry("2", version="5")).ready
    worker = next(iter(server.service._workers.local.values()))
    assert set(worker.models) == {(MODEL, "1"), (MODEL, "5")}


def test_load_time_check_failure_is_rolled_back(
    server: ServiceThread, versions: Versions, tmp_path: Path
) -> None:
    """NaN weights: the engine's own check (split vs. forward on a probe graph) refuses."""
    import torch

    state = torch.load(versions.weights["1"], weights_only=True)
    torch.save({k: torch.full_like(v, float("nan")) for k, v in state.items()}, tmp_path / "nan.pt")
    refused = pytest.raises(InvalidArgumentError, match="version '6': layer-wise evaluation")
    with server.admin() as admin, refused:
        admin.load_model(versions.entry("1", version="6", weights=str(tmp_path / "nan.pt")))
    assert states(server) == {"1": ("ready", True, 100)}
    worker = next(iter(server.service._workers.local.values()))
    assert set(worker.models) == {(MODEL, "1")}


def test_self_check_failure_is_rolled_back(tmp_path: Path) -> None:
    """A version whose rows on the served graph are not finite never serves."""
    nan = write_versions(tmp_path, {"1": 1, "2": 2}, nan_features=True)
    server = ServiceThread(nan.config(["1"]))  # start-up versions: the engine's check only
    try:
        with server.admin() as admin:
            with pytest.raises(HopserveError, match="failed its self-check: 8 of 8 rows") as err:
                admin.load_model(nan.entry("2"), make_default=True)
            assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert states(server) == {"1": ("ready", True, 100)}
        worker = next(iter(server.service._workers.local.values()))
        assert set(worker.models) == {(MODEL, "1")}
        assert server.sample("hopserve_model_ready", model=MODEL, version="2") is None
    finally:
        server.stop()


def test_unloading_the_last_version_forgets_the_name(
    server: ServiceThread, versions: Versions
) -> None:
    with server.admin() as admin, server.client() as client:
        assert admin.unload_model(MODEL, "1").version == "1"
        assert client.list_models() == []
        with pytest.raises(NotFoundError, match="model 'tiny' not found"):
            client.get_embeddings(MODEL, [7])
        assert server.health(MODEL) == "NOT_SERVING"
        info = admin.load_model(versions.entry("2"))  # a name's first version: its default
        assert info.is_default and client.get_model(MODEL).version == "2"


def test_several_versions_from_the_config_file(versions: Versions) -> None:
    server = ServiceThread(versions.config(["1", "2"], default="2"))
    try:
        assert states(server) == {"1": ("ready", False, 0), "2": ("ready", True, 100)}
        ids = ids_of(versions, seed=5)
        with server.client() as client:
            assert client.get_embeddings_with_info(MODEL, ids).model_version == "2"
        # SIGHUP's reload: version 3 becomes the default, 1 goes, 2 stays
        config = versions.config(["2", "3"], default="3")
        problems = server.call(lambda: server.service.reload_models(config))
        assert problems == []
        assert states(server) == {"2": ("ready", False, 0), "3": ("ready", True, 100)}
        with server.client() as client:
            res = client.get_embeddings_with_info(MODEL, ids)
            assert res.model_version == "3" and versions.matches("3", ids, res.embeddings)
    finally:
        server.stop()


def test_admin_rpcs_need_the_admin_scope(versions: Versions, tmp_path: Path) -> None:
    from hopserve.security.tokens import hash_token

    reader, admin_token = "r" * 40, "a" * 40
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        "tokens:\n"
        f"  - {{name: reader, scopes: [embeddings:read], sha256: {hash_token(reader)}}}\n"
        f"  - {{name: admin, scopes: [admin], sha256: {hash_token(admin_token)}}}\n"
    )
    server = ServiceThread(versions.config(["1"], security={"tokens_file": str(tokens)}))
    try:
        with server.admin(token=reader) as admin:
            with pytest.raises(HopserveError, match="needs scope 'admin'") as err:
                admin.load_model(versions.entry("2"))
            assert err.value.code is grpc.StatusCode.PERMISSION_DENIED
        with server.admin(token=admin_token) as admin:
            assert admin.load_model(versions.entry("2")).version == "2"
    finally:
        server.stop()


def _wait(condition: object, timeout: float = 20.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if condition():  # type: ignore[operator]
            return
        done.wait(0.02)
    raise AssertionError("condition not reached in time")
