"""EmbeddingClient and AsyncEmbeddingClient against a real loopback gRPC server.

Every test runs for both clients through the ``make_client`` fixture.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from hopserve.client import (
    AsyncEmbeddingClient,
    BlockInfo,
    DeadlineExceededError,
    EmbeddingClient,
    HopserveError,
    InvalidArgumentError,
    MalformedResponseError,
    ModelInfo,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)

MODEL = "sage"  # the model the fake server (conftest.py) serves
DIM = 4  # its embedding width
IDS = np.array([17, 3, 3, 99, 0, 42, 5, 8], dtype=np.int64)  # unsorted, with a duplicate


def test_rows_come_back_in_request_order(fake, make_client) -> None:
    client = make_client(fake.target)
    emb = client.get_embeddings(MODEL, IDS)
    assert emb.dtype == np.float32 and emb.shape == (len(IDS), DIM)
    assert emb.flags.writeable and emb.flags.c_contiguous
    np.testing.assert_array_equal(emb, fake.service.rows(IDS))
    # plain lists and other integer dtypes are accepted too
    np.testing.assert_array_equal(client.get_embeddings(MODEL, [3, 1]), fake.service.rows([3, 1]))
    np.testing.assert_array_equal(
        client.get_embeddings(MODEL, IDS.astype(np.uint16)), fake.service.rows(IDS)
    )


def test_sync_and_async_clients_return_identical_arrays(fake) -> None:
    ids = np.random.default_rng(0).integers(0, 10_000, size=257)
    with EmbeddingClient(fake.target, max_nodes_per_request=50) as client:
        sync = client.get_embeddings(MODEL, ids)

    async def run() -> np.ndarray:
        async with AsyncEmbeddingClient(fake.target, max_nodes_per_request=50) as aclient:
            return await aclient.get_embeddings(MODEL, ids)

    np.testing.assert_array_equal(sync, asyncio.run(run()))
    np.testing.assert_array_equal(sync, fake.service.rows(ids))


def test_request_fields_reach_the_server(fake, make_client) -> None:
    client = make_client(fake.target)
    client.get_embeddings(
        MODEL, [1, 2], fanouts=[10, -1], cache_policy="REFRESH", model_version=3, seed=7
    )
    (request,) = fake.service.calls("GetEmbeddings")
    assert list(request.node_ids) == [1, 2]
    assert request.model == MODEL and request.model_version == "3"
    assert list(request.options.fanouts) == [10, -1]
    assert request.options.cache_policy == 2  # CACHE_REFRESH
    assert request.options.HasField("seed") and request.options.seed == 7
    client.get_embeddings(MODEL, [1])
    request = fake.service.calls("GetEmbeddings")[-1]
    assert request.model_version == "" and not request.options.HasField("seed")
    assert request.options.cache_policy == 1 and not request.options.fanouts  # use, exact


def test_large_requests_are_split_and_reassembled(fake, make_client) -> None:
    ids = np.arange(50)[::-1] * 3
    client = make_client(fake.target, max_nodes_per_request=7)
    info = client.get_embeddings_with_info(MODEL, ids)
    np.testing.assert_array_equal(info.embeddings, fake.service.rows(ids))
    calls = fake.service.calls("GetEmbeddings")
    assert [len(c.node_ids) for c in calls] == [7] * 7 + [1]
    assert np.array_equal(np.concatenate([list(c.node_ids) for c in calls]), ids)
    # the first answer pins the model version for the rest of the call
    assert [c.model_version for c in calls] == [""] + ["3"] * 7
    assert info.model == MODEL and info.model_version == "3" and info.graph_version == "g1"
    assert info.cache_hits == int((ids % 2 == 0).sum())
    assert info.timing["total"] == pytest.approx(8.0) and info.timing["compute"] == 4.0
    assert info.layer_compute == pytest.approx((1.6, 2.4))


def test_stream_embeddings(fake, make_client) -> None:
    ids = np.arange(20) + 100
    client = make_client(fake.target, max_nodes_per_request=8)
    pieces = list(client.stream_embeddings(MODEL, ids))
    offsets = [offset for offset, _ in pieces]
    sizes = [rows.shape[0] for _, rows in pieces]
    assert offsets == list(np.cumsum([0, *sizes[:-1]])) and sum(sizes) == len(ids)
    np.testing.assert_array_equal(np.concatenate([r for _, r in pieces]), fake.service.rows(ids))
    assert all(r.dtype == np.float32 and r.flags.writeable for _, r in pieces)
    assert [len(c.node_ids) for c in fake.service.calls("StreamEmbeddings")] == [8, 8, 4]


def test_stream_resumes_after_a_broken_stream(fake, make_client) -> None:
    fake.service.break_stream_after = 2  # UNAVAILABLE after 2 chunks of 3 rows
    ids = np.arange(10) * 7
    client = make_client(fake.target)
    pieces = list(client.stream_embeddings(MODEL, ids))
    np.testing.assert_array_equal(np.concatenate([r for _, r in pieces]), fake.service.rows(ids))
    first, second = fake.service.calls("StreamEmbeddings")
    assert list(second.node_ids) == ids[6:].tolist() and second.model_version == "3"


def test_stream_validates_arguments_eagerly(fake) -> None:
    with EmbeddingClient(fake.target) as client, pytest.raises(InvalidArgumentError):
        client.stream_embeddings(MODEL, [])
    assert not fake.service.calls("StreamEmbeddings")


def test_stream_stopped_early_cancels_the_call(fake) -> None:
    with EmbeddingClient(fake.target) as client:
        stream = client.stream_embeddings(MODEL, np.arange(30))
        offset, rows = next(stream)
        stream.close()
        assert offset == 0 and rows.shape == (3, DIM)
        assert client.get_embeddings(MODEL, [1]).shape == (1, DIM)  # channel still fine


def test_list_and_get_model(fake, make_client) -> None:
    client = make_client(fake.target)
    (info,) = client.list_models()
    assert isinstance(info, ModelInfo)
    assert (info.name, info.version, info.dim, info.num_layers) == (MODEL, "3", DIM, 2)
    assert (info.graph_num_nodes, info.graph_num_edges, info.graph_version) == (100, 400, "g1")
    assert info.ready and info.dtype == "float32"
    assert info.blocks[0] == BlockInfo(1, "SAGEConv", 8, 16, "")
    assert client.get_model(MODEL) == info
    with pytest.raises(NotFoundError, match="'nope' not found") as exc:
        client.get_model("nope")
    assert exc.value.code is grpc.StatusCode.NOT_FOUND and exc.value.rpc == "GetModel"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
        (grpc.StatusCode.OUT_OF_RANGE, InvalidArgumentError),
        (grpc.StatusCode.NOT_FOUND, NotFoundError),
        (grpc.StatusCode.UNAVAILABLE, UnavailableError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceededError),
        (grpc.StatusCode.UNAUTHENTICATED, UnauthenticatedError),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDeniedError),
        (grpc.StatusCode.INTERNAL, HopserveError),
    ],
)
def test_status_codes_map_to_typed_errors(fake, make_client, code, cls) -> None:
    fake.service.fail(code, details=f"boom {code.name}")
    client = make_client(fake.target, max_retries=0)
    with pytest.raises(HopserveError) as exc:
        client.get_embeddings(MODEL, [1])
    err = exc.value
    assert type(err) is cls
    assert err.code is code and err.details == f"boom {code.name}" and err.rpc == "GetEmbeddings"
    assert f"[{code.name}] GetEmbeddings: boom {code.name}" == str(err)
    assert not isinstance(err, grpc.RpcError)
    assert err.__cause__ is None and err.__suppress_context__  # raise ... from None


def test_server_side_errors_carry_the_details(fake, make_client) -> None:
    client = make_client(fake.target)
    with pytest.raises(NotFoundError, match="model 'nope' not found"):
        client.get_embeddings("nope", [1])
    with pytest.raises(InvalidArgumentError, match="unknown node id -5") as exc:
        client.get_embeddings(MODEL, [1, -5])
    assert isinstance(exc.value, ValueError)
    with pytest.raises(InvalidArgumentError, match="fanouts has 3 entries"):
        client.get_embeddings(MODEL, [1], fanouts=[5, 5, 5])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"node_ids": []}, "node_ids is empty"),
        ({"node_ids": [[1, 2]]}, r"must be 1-D, got shape \(1, 2\)"),
        ({"node_ids": 5}, r"must be 1-D, got shape \(\)"),
        ({"node_ids": [1.5, 2.0]}, "must be integers, got dtype float64"),
        ({"node_ids": ["a"]}, "must be integers"),
        ({"node_ids": [True]}, "must be integers, got dtype bool"),
        ({"node_ids": np.array([2**63], dtype=np.uint64)}, "does not fit in int64"),
        ({"node_ids": [[1], [2, 3]]}, "not array-like|must be 1-D"),
        ({"model": ""}, "model must be a non-empty string"),
        ({"fanouts": [10, 0]}, r"fanouts\[1\] \(layer 2\) must be -1 \(all\) or >= 1, got 0"),
        ({"fanouts": "10,10"}, "fanouts must be a sequence"),
        ({"fanouts": [1.5]}, "fanouts entry must be an integer"),
        ({"cache_policy": "sometimes"}, "cache_policy must be one of"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*64\)"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"model_version": 1.5}, "model_version must be"),
    ],
)
def test_client_side_validation(fake, make_client, kwargs: dict, match: str) -> None:
    client = make_client(fake.target)
    args = {"model": MODEL, "node_ids": [1, 2]} | kwargs
    model, node_ids = args.pop("model"), args.pop("node_ids")
    with pytest.raises(InvalidArgumentError, match=match) as exc:
        client.get_embeddings(model, node_ids, **args)
    assert isinstance(exc.value, ValueError) and exc.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert not fake.service.calls("GetEmbeddings")


def test_malformed_response_is_detected(fake, make_client) -> None:
    fake.service.corrupt = True
    client = make_client(fake.target)
    with pytest.raises(MalformedResponseError, match="is 31 bytes, expected 32"):
        client.get_embeddings(MODEL, [1, 2])
    with pytest.raises(MalformedResponseError, match="bytes, expected"):
        list(client.stream_embeddings(MODEL, [1, 2]))


def test_closed_client_refuses_calls(fake, make_client) -> None:
    client = make_client(fake.target)
    client.get_embeddings(MODEL, [1])
    client.close()
    with pytest.raises(RuntimeError, match="is closed"):
        client.get_embeddings(MODEL, [1])


def test_context_managers(fake) -> None:
    with EmbeddingClient(fake.target) as client:
        assert client.get_embeddings(MODEL, [2]).shape == (1, DIM)
    with pytest.raises(RuntimeError, match="is closed"):
        client.list_models()

    async def run() -> None:
        async with AsyncEmbeddingClient(fake.target) as aclient:
            assert (await aclient.get_embeddings(MODEL, [2])).shape == (1, DIM)
        with pytest.raises(RuntimeError, match="is closed"):
            await aclient.list_models()

    asyncio.run(run())


def test_async_client_is_bound_to_one_event_loop(fake) -> None:
    client = AsyncEmbeddingClient(fake.target)
    asyncio.run(client.get_embeddings(MODEL, [1]))
    with pytest.raises(RuntimeError, match="bound to the event loop"):
        asyncio.run(client.get_embeddings(MODEL, [1]))
