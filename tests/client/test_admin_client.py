"""The admin clients: symmetric API, client-side checks, wire encoding, error mapping.

Calls go over a real loopback gRPC server running the real ``AdminService`` servicer;
its graph RPCs go to :class:`RecordingGraphs`, a test double of the graph owner (another
component) that records each request and answers from it. Model RPCs are exercised
end to end in tests/server/test_admin_models.py.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from support.admin_double import AdminServer, RecordingGraphs

from hopserve.client import (
    AdminClient,
    AsyncAdminClient,
    GraphInfo,
    HopserveError,
    InvalidArgumentError,
    NotFoundError,
)


def public_methods(cls: type) -> dict[str, object]:
    return {n: m for n, m in inspect.getmembers(cls, callable) if not n.startswith("_")}


# ----------------------------------------------------------------------------- parity


def test_same_public_methods() -> None:
    assert set(public_methods(AdminClient)) == set(public_methods(AsyncAdminClient))
    assert {
        "update_graph",
        "compact_graph",
        "get_graph",
        "load_model",
        "unload_model",
        "set_default_model",
        "close",
    } <= set(public_methods(AdminClient))


@pytest.mark.parametrize("name", sorted(public_methods(AdminClient)))
def test_same_parameters_and_async_twins(name: str) -> None:
    sync, aio = getattr(AdminClient, name), getattr(AsyncAdminClient, name)
    params = [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(sync).parameters.values()
    ]
    assert params == [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(aio).parameters.values()
    ]
    assert inspect.iscoroutinefunction(aio) and not inspect.iscoroutinefunction(sync)


def test_constructors_match() -> None:
    assert inspect.signature(AdminClient.__init__) == inspect.signature(AsyncAdminClient.__init__)


# ----------------------------------------------------------------------------- server


@pytest.fixture
def graphs() -> RecordingGraphs:
    return RecordingGraphs()


@pytest.fixture
def server(graphs: RecordingGraphs) -> Iterator[AdminServer]:
    running = AdminServer(graphs)
    yield running
    running.stop()


class BlockingAsyncAdmin:
    """Drives an :class:`AsyncAdminClient` from sync test code on a private loop."""

    def __init__(self, client: AsyncAdminClient) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **kw: self.loop.run_until_complete(attr(*a, **kw))
        return attr

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def admin(request: pytest.FixtureRequest, server: AdminServer) -> Iterator[Any]:
    target = f"127.0.0.1:{server.port}"
    if request.param == "sync":
        client: Any = AdminClient(target, timeout=10, backoff_base=0.01)
    else:
        client = BlockingAsyncAdmin(AsyncAdminClient(target, timeout=10, backoff_base=0.01))
    yield client
    client.close()


# ----------------------------------------------------------------------------- calls


def test_update_graph_encodes_every_part(admin: Any, graphs: RecordingGraphs) -> None:
    features = np.arange(6, dtype=np.float64).reshape(2, 3) / 7  # cast to float32
    result = admin.update_graph(
        "sage",
        add_nodes=([100, 101], features),
        add_edges=(np.array([100, 1], dtype=np.uint32), [101, 100]),
        remove_edges=([1], [2]),
        set_features=([5], np.ones((1, 3), dtype=np.float32)),
        idempotency_key="batch-7",
    )
    assert (result.graph_seq, result.nodes_added, result.edges_added) == (1, 2, 2)
    assert (result.edges_removed, result.features_set, result.replayed) == (1, 1, False)
    (request,) = graphs.requests
    assert request.model == "sage" and request.idempotency_key == "batch-7"
    assert list(request.add_nodes.node_ids) == [100, 101] and request.add_nodes.dim == 3
    sent = np.frombuffer(request.add_nodes.features, dtype="<f4").reshape(2, 3)
    np.testing.assert_array_equal(sent, features.astype(np.float32))
    assert (list(request.add_edges.src), list(request.add_edges.dst)) == ([100, 1], [101, 100])
    assert (list(request.remove_edges.src), list(request.remove_edges.dst)) == ([1], [2])
    assert list(request.set_features.node_ids) == [5] and len(request.set_features.features) == 12


def test_graph_info_and_compaction(admin: Any, graphs: RecordingGraphs) -> None:
    info = admin.get_graph("sage")
    assert info == GraphInfo(path="/g", graph_version="g1", graph_seq=3, num_nodes=10,
                             num_edges=20, log_batches=3, models=["sage"])  # fmt: skip
    assert admin.compact_graph("sage").compacting
    with pytest.raises(NotFoundError, match="'nope' not found") as err:
        admin.get_graph("nope")
    assert err.value.rpc == "GetGraph"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one of add_nodes"),
        ({"add_nodes": ([1, 2], np.zeros((3, 4)))}, "2 node IDs but 3 feature rows"),
        ({"add_nodes": ([1], np.zeros(4))}, r"must be 2-D \[n, dim\], got shape \(4,\)"),
        ({"add_nodes": ([1, 1], np.zeros((2, 4)))}, "node IDs listed twice: 1"),
        ({"add_nodes": ([1], [[np.nan, 0]])}, "features of node 1 .row 0. are not finite"),
        ({"add_nodes": ([1], [[1e300, 0]])}, "not finite in float32"),
        ({"add_nodes": ([1.5], [[1.0]])}, "node_ids: must be integers, got dtype float64"),
        ({"add_nodes": ([1], [["a"]])}, "features must be numbers"),
        ({"add_nodes": [1, 2, 3]}, r"must be a pair \(node_ids, features\)"),
        ({"add_edges": ([1, 2], [3])}, "2 sources but 1 destinations"),
        ({"remove_edges": ([], [])}, "no edges given"),
        ({"add_edges": ([[1]], [[2]])}, r"must be 1-D, got shape \(1, 1\)"),
        ({"add_edges": ([2**64 - 1], [1])}, "does not fit in int64"),
        ({"add_edges": ([1], [2]), "idempotency_key": "x" * 129}, "at most 128 printable"),
        ({"add_edges": ([1], [2]), "idempotency_key": "a\nb"}, "not printable"),
        ({"add_edges": ([1], [2]), "idempotency_key": ""}, "non-empty string"),
    ],
)
def test_update_graph_is_checked_before_sending(
    admin: Any, graphs: RecordingGraphs, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        admin.update_graph("sage", **kwargs)
    assert graphs.requests == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.load_model(""), "config is empty"),
        (lambda a: a.load_model(42), "YAML/JSON text or a mapping, got int"),
        (lambda a: a.load_model({"name": "x", "graph": "g"}), "no 'entrypoint'"),
        (lambda a: a.load_model({"name": "x", "entrypoint": "m:C", "graph": object()}),
         "cannot be sent as JSON"),
        (lambda a: a.load_model("name: x", make_default="yes"), "make_default must be a bool"),
        (lambda a: a.unload_model("sage", ""), "version must be a non-empty str"),
        (lambda a: a.unload_model("", "1"), "model must be a non-empty string"),
        (lambda a: a.set_default_model("sage", "1", canary_percent=10), "go together"),
        (lambda a: a.set_default_model("sage", "1", "2", 0), "go together"),
        (lambda a: a.set_default_model("sage", "1", "2", 101), "0..100, got 101"),
        (lambda a: a.set_default_model("sage", "1", "1", 5), "is the default version itself"),
        (lambda a: a.set_default_model("sage", True), "non-empty str or an int, got True"),
    ],
)  # fmt: skip
def test_model_calls_are_checked_before_sending(admin: Any, call: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        call(admin)


def test_model_errors_come_back_typed(admin: Any) -> None:
    """The real lifecycle behind the service (no models served): statuses map to types."""
    with pytest.raises(NotFoundError, match="model 'sage' not found"):
        admin.unload_model("sage", 1)
    with pytest.raises(NotFoundError, match="model 'sage' not found"):
        admin.set_default_model("sage", "2", canary_version=3, canary_percent=10)
    with pytest.raises(InvalidArgumentError, match="config: entrypoint: Field required"):
        admin.load_model("name: sage\ngraph: g\n")
    with pytest.raises(InvalidArgumentError, match="not a graph this server serves"):
        admin.load_model({"name": "sage", "entrypoint": "m:C", "graph": "/"})


def test_retries_only_what_is_safe(admin: Any, graphs: RecordingGraphs) -> None:
    # a refused call (rate limit: never ran) is retried; an update without a key is not
    graphs.fail = (grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
    assert admin.update_graph("sage", add_edges=([1], [2])).graph_seq == 2
    assert len(graphs.requests) == 2
    graphs.fail = (grpc.StatusCode.UNAVAILABLE, "blip")
    with pytest.raises(HopserveError, match="blip"):
        admin.update_graph("sage", add_edges=([1], [2]))
    assert len(graphs.requests) == 3
    # with an idempotency key it is
    graphs.fail = (grpc.StatusCode.UNAVAILABLE, "blip")
    result = admin.update_graph("sage", add_edges=([1], [2]), idempotency_key="seen")
    assert result.replayed and len(graphs.requests) == 5
    graphs.fail = (grpc.StatusCode.UNAVAILABLE, "blip")
    assert admin.get_graph("sage").graph_seq == 3  # reads always are


def test_graph_rpcs_unimplemented_without_a_handler() -> None:
    server = AdminServer(None)
    try:
        with AdminClient(f"127.0.0.1:{server.port}", timeout=10) as admin:
            for call in (
                lambda: admin.get_graph("sage"),
                lambda: admin.compact_graph("sage"),
                lambda: admin.update_graph("sage", add_edges=([1], [2])),
            ):
                with pytest.raises(HopserveError, match="not enabled on this server") as err:
                    call()
                assert err.value.code is grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop()
