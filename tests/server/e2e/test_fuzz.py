"""Hostile and random traffic against a live front-end: only documented status codes.

Real components throughout (``conftest.py``): the grpc.aio server on loopback with the
in-process worker and engine, and the session's redis-server as cache. Expected rows come
from the engine run directly (``evaluator``).

* Targeted regressions: undecodable request bytes are INVALID_ARGUMENT (not UNKNOWN, no
  traceback in the log); client values echoed in errors are truncated and every status
  message is bounded.
* :func:`test_fuzz_front_end`: hypothesis draws ≥ 2,000 requests (valid, invalid,
  byte-mutated, oversized, hostile names, short deadlines, client cancellations, unary and
  streaming) sent concurrently so cancellations race with batching; every answer is a
  documented code, every OK answer equals the engine, and afterwards the server is healthy
  and not wedged. It runs twice: against a plaintext port without tokens, and against a
  TLS port with tokens, where calls also carry no, a wrong, or an under-scoped token
  (UNAUTHENTICATED / PERMISSION_DENIED whatever the request bytes).

The module is one harness (request strategies, sender, oracle) around one live server;
it stays in one file (about 500 lines) so the strategies and the checks they feed read
together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support import assert_exact
from support.logs import Records, capture_records
from support.pki import ADMIN_TOKEN, READ_TOKEN, write_pki, write_tokens

from hopserve import LayerwiseEvaluator
from hopserve.config.security import SecurityConfig
from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb

MODEL = "sage"
SERVICE = "/hopserve.v1.EmbeddingService/"
MAX_DETAILS = 1024  # bytes of a status message (hopserve.rpc.MAX_STATUS_BYTES)
MAX_REQUEST_NODES = 500
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


class _Records(Records):
    """Every record logged while installed, and what of it counts as a flood."""

    def floods(self) -> list[str]:
        """What the log must not hold under hostile traffic: an error of hopserve's own, a
        decode error, or an error line of grpc's that was not rate-limited (grpc may log
        one ``ExecuteBatchError`` when a client cancels a stream while the server sends its
        final status)."""
        counts: dict[str, int] = {}
        for line in self.errors():
            counts[line] = counts.get(line, 0) + 1
        return [
            f"{n}x {line}"
            for line, n in counts.items()
            if n > 1 or line.startswith("hopserve") or "DecodeError" in line
        ]


@pytest.fixture
def records() -> Iterator[_Records]:
    with capture_records(_Records()) as handler:
        yield handler


def _fuzz_config(make_config: Callable[..., Any]) -> Any:
    """Small limits (so that "too many" and "queue full" are cheap)."""
    return make_config(
        max_batch_targets=64, max_request_nodes=MAX_REQUEST_NODES, max_queue=64, max_wait_ms=5
    )


@pytest.fixture(scope="module")
def fuzz_server(make_config: Callable[..., Any], launch: Callable[..., Any]) -> Iterator[Any]:
    """A plaintext front-end without tokens; streams chunked into 7-row pieces."""
    server = launch(_fuzz_config(make_config))
    server.service.edge.max_chunk_bytes = 7 * 5 * 4
    server.credentials = None
    yield server
    server.stop()


@pytest.fixture(scope="module")
def secure_fuzz_server(
    make_config: Callable[..., Any], launch: Callable[..., Any], tmp_path_factory: Any
) -> Iterator[Any]:
    """The same behind TLS and tokens (``reader`` may query, ``ops`` may not)."""
    folder = tmp_path_factory.mktemp("fuzz-secrets")
    pki = write_pki(folder)
    security = SecurityConfig.model_validate(
        {"tls": {"cert_file": pki.server_cert, "key_file": pki.server_key},
         "tokens_file": write_tokens(folder / "tokens.yaml")}
    )  # fmt: skip
    server = launch(_fuzz_config(make_config).model_copy(update={"security": security}))
    server.service.edge.max_chunk_bytes = 7 * 5 * 4
    server.credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    yield server
    server.stop()


def _unary(channel: grpc.Channel, method: str) -> Any:
    """A raw bytes-in, bytes-out unary method (no client-side encoding at all)."""
    return channel.unary_unary(SERVICE + method, request_serializer=None,
                               response_deserializer=None)  # fmt: skip


def _call_error(fn: Callable[..., Any], *args: Any) -> grpc.RpcError:
    """The error ``fn(*args, timeout=10)`` raises (it must raise one)."""
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, timeout=10)
    return info.value


# ----------------------------------------------------------------------------- regressions


def test_undecodable_requests_are_invalid_argument(fuzz_server, records, all_ids) -> None:
    good = pb.GetEmbeddingsRequest(model=MODEL, node_ids=[int(all_ids[3])]).SerializeToString()
    bad_utf8 = b"\x0a\x03\xff\xfe\xfd"  # field 1 (model) with invalid UTF-8
    truncated = b"\x0a\x10sage"  # field 1 claims 16 bytes, 4 follow
    with grpc.insecure_channel(fuzz_server.target) as channel:
        for method in ("GetEmbeddings", "GetModel"):
            for data in (bad_utf8, truncated, b"\xff" * 9):
                err = _call_error(_unary(channel, method), data)
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, data, err)
                assert "not a valid hopserve.v1." in err.details()
        stream = channel.unary_stream(SERVICE + "StreamEmbeddings")
        err = _call_error(lambda **kw: list(stream(bad_utf8, **kw)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "String field had bad UTF-8" in err.details()
        # the service still answers decodable requests, health and reflection stay up
        reply = pb.GetEmbeddingsResponse.FromString(_unary(channel, "GetEmbeddings")(good))
        assert reply.num_nodes == 1
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        answer = next(
            reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([listing]))
        )
        names = {s.name for s in answer.list_services_response.service}
        assert {"hopserve.v1.EmbeddingService", "grpc.health.v1.Health"} <= names
    assert not records.errors(), records.errors()
    rejected = fuzz_server.sample(
        "hopserve_requests_total", method="GetEmbeddings", model="_unknown",
        outcome="invalid_argument",
    )  # fmt: skip
    assert rejected >= 3


def test_client_values_in_errors_are_truncated(fuzz_server, all_ids) -> None:
    huge = "m" * 100_000
    cases = [
        pb.GetEmbeddingsRequest(model=huge, node_ids=[1]),
        pb.GetEmbeddingsRequest(model=MODEL, model_version=huge, node_ids=[1]),
        pb.GetEmbeddingsRequest(model="\x00\x1b[31m\u202e" + "ü" * 5000, node_ids=[1]),
        pb.GetEmbeddingsRequest(
            model=MODEL, node_ids=[int(all_ids[0])], options=pb.QueryOptions(fanouts=[3] * 9000)
        ),
    ]
    with grpc.insecure_channel(fuzz_server.target) as channel:
        for request in cases:
            data = request.SerializeToString()
            err = _call_error(_unary(channel, "GetEmbeddings"), data)
            details = err.details()
            assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), err
            assert len(details.encode()) <= MAX_DETAILS, len(details.encode())
            assert "\x00" not in details and "\x1b" not in details
        err = _call_error(
            _unary(channel, "GetModel"), pb.GetModelRequest(name=huge).SerializeToString()
        )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "'" + "m" * 64 + "'…(100000 bytes)" in err.details()
    assert len(err.details()) < 300


# ----------------------------------------------------------------------------- the fuzz test

NUM_LAYERS = 3
CALLS_PER_EXAMPLE = 40
EXAMPLES = 52  # 52 x 40 = 2,080 calls per run
LONG_TIMEOUT_S = 15.0  # a call with this deadline that times out means a wedged server
BURST_S = 10.0  # afterwards, a burst of 48 normal requests is answered within this
SAMPLED_FANOUTS = ([2, 2, 2], [1, 3, -1], [5, -1, 2], [-1, -1, 1])
SEEDS = (None, 0, 7, 2**63, 2**64 - 1)
UNKNOWN_IDS = (10_001, 9_999, -1, 0, 2**63 - 1, -(2**63), 12_100)
BAD_FANOUTS = ([2, 2], [2, 2, 2, 2], [0, 2, 2], [2, -2, 2], [-(2**31), 1, 1], [2] * 9000)
HOSTILE_NAMES = (
    "x" * 100_000,
    "\x00\x01\x02\x7f",
    "\x1b[31mred\x1b[0m\r\n",
    "\u202esage",
    "🙂" * 2000,
    "sage\n",
    " sage",
    "SAGE",
    "",
    "%s%n%x{}",
)
OVERSIZED = (
    b"\x0a\x04sage" + b"\x00" * (4 << 20),  # past the server's 4 MiB receive limit
    pb.GetEmbeddingsRequest(model=MODEL, node_ids=[-1] * 500_000).SerializeToString(),  # 5 MB
)
RECEIVE_LIMIT = 4 << 20  # the server's grpc.max_receive_message_length here
TOKENS = {"valid": READ_TOKEN, "none": None, "wrong": READ_TOKEN[::-1], "scope": ADMIN_TOKEN}
REFUSED = {"none": grpc.StatusCode.UNAUTHENTICATED, "wrong": grpc.StatusCode.UNAUTHENTICATED,
           "scope": grpc.StatusCode.PERMISSION_DENIED}  # fmt: skip


class Call:
    """One RPC of the fuzz run, sent as raw bytes (a plain class, not a dataclass, so that
    hypothesis prints a failing batch with the short ``repr`` below)."""

    def __init__(self, kind: str, method: str, data: bytes, timeout: float = LONG_TIMEOUT_S):
        self.kind = kind
        self.method = method  # GetEmbeddings | StreamEmbeddings | ListModels | GetModel
        self.data = data
        self.timeout = timeout
        self.cancel_after: float | None = None  # seconds after the start
        self.cancel_chunks: int | None = None  # streams: cancel after this many chunks
        self.auth = "valid"  # which token it carries (see TOKENS); ignored without tokens

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        token = TOKENS[self.auth]
        return () if token is None else (("authorization", f"Bearer {token}"),)

    @property
    def cancels(self) -> bool:
        return self.cancel_after is not None or self.cancel_chunks is not None

    def __repr__(self) -> str:
        data = self.data if len(self.data) <= 48 else self.data[:48] + b"..."
        return (
            f"Call({self.kind!r}, {self.method!r}, {len(self.data)} bytes {data!r}, "
            f"timeout={self.timeout}, cancel_after={self.cancel_after}, "
            f"cancel_chunks={self.cancel_chunks}, auth={self.auth!r})"
        )


@dataclass
class Outcome:
    """What the client saw."""

    code: grpc.StatusCode
    details: str = ""
    reply: bytes | None = None  # unary OK answer
    chunks: list[bytes] = field(default_factory=list)  # stream messages received


def _ids(all_ids: np.ndarray, seed: int, size: int) -> list[int]:
    """``size`` real IDs drawn with replacement (duplicates likely)."""
    return [int(v) for v in np.random.default_rng(seed).choice(all_ids, size=size)]


def _mutate(data: bytes, seed: int, count: int) -> bytes:
    """``count`` random byte-level edits: flip, insert, delete, truncate or repeat."""
    rng = np.random.default_rng(seed)
    buf = bytearray(data)
    for _ in range(count):
        op = int(rng.integers(5))
        pos = int(rng.integers(len(buf) + 1))
        if op == 0 and pos < len(buf):
            buf[pos] ^= 1 << int(rng.integers(8))
        elif op == 1:
            buf[pos:pos] = bytes([int(rng.integers(256))])
        elif op == 2:
            del buf[pos : pos + 1]
        elif op == 3:
            del buf[pos:]
        else:
            buf[pos:pos] = buf[pos : pos + int(rng.integers(1, 9))]
    return bytes(buf)


@st.composite
def embedding_requests(draw: st.DrawFn, all_ids: np.ndarray) -> tuple[str, pb.GetEmbeddingsRequest]:
    """A valid or invalid ``GetEmbeddingsRequest`` and its kind."""
    kind = draw(st.sampled_from(
        ["exact"] * 8 + ["sampled"] * 3 + ["big"] + ["unknown_ids", "empty", "too_many",
         "bad_fanouts", "unknown_model", "unknown_version", "bad_policy"]
    ))  # fmt: skip
    seed = draw(st.integers(0, 2**32 - 1))
    ids = _ids(all_ids, seed, draw(st.integers(1, 40)))
    request = pb.GetEmbeddingsRequest(model=MODEL, node_ids=ids)
    request.model_version = draw(st.sampled_from(["", "", "1"]))
    request.options.cache_policy = draw(st.sampled_from([0, 1, 2, 3]))
    if kind == "exact":
        request.options.fanouts.extend(draw(st.sampled_from([[], [], [-1] * NUM_LAYERS])))
    elif kind == "sampled":
        request.options.fanouts.extend(draw(st.sampled_from(SAMPLED_FANOUTS)))
        seed_value = draw(st.sampled_from(SEEDS))
        if seed_value is not None:
            request.options.seed = seed_value
    elif kind == "big":  # several stream slices (max_batch_targets 64)
        request.node_ids[:] = _ids(all_ids, seed, draw(st.integers(65, MAX_REQUEST_NODES)))
    elif kind == "unknown_ids":
        at = draw(st.integers(0, len(ids)))
        request.node_ids.insert(at, draw(st.sampled_from(UNKNOWN_IDS)))
    elif kind == "empty":
        del request.node_ids[:]
    elif kind == "too_many":
        extra = draw(st.integers(1, 100))
        request.node_ids[:] = _ids(all_ids, seed, MAX_REQUEST_NODES + extra)
    elif kind == "bad_fanouts":
        request.options.fanouts.extend(draw(st.sampled_from(BAD_FANOUTS)))
        request.options.seed = 1
    elif kind == "unknown_model":
        request.model = draw(st.sampled_from(("nope", *HOSTILE_NAMES)))
    elif kind == "unknown_version":
        request.model_version = draw(st.sampled_from(("2", "1 ", *HOSTILE_NAMES[:5])))
    elif kind == "bad_policy":
        request.options.cache_policy = draw(st.sampled_from([4, 99, -1, 2**31 - 1]))
    return kind, request


@st.composite
def calls(draw: st.DrawFn, all_ids: np.ndarray) -> Call:
    """Any call of the fuzz run, with its deadline and cancellation."""
    family = draw(st.sampled_from(["request"] * 14 + ["mutated"] * 4 + ["model", "other"]))
    if family in ("request", "mutated"):
        kind, request = draw(embedding_requests(all_ids))
        method = draw(st.sampled_from(["GetEmbeddings", "GetEmbeddings", "StreamEmbeddings"]))
        data = request.SerializeToString()
        if family == "mutated":
            kind = f"mutated {kind}"
            data = _mutate(data, draw(st.integers(0, 2**32 - 1)), draw(st.integers(1, 4)))
    elif family == "model":
        name = draw(st.sampled_from((MODEL, MODEL, "nope", *HOSTILE_NAMES)))
        version = draw(st.sampled_from(["", "1", "2", HOSTILE_NAMES[0]]))
        method, kind = "GetModel", "get_model"
        data = pb.GetModelRequest(name=name, version=version).SerializeToString()
    else:
        kind = draw(st.sampled_from(["list", "garbage", "oversized"]))
        method = draw(st.sampled_from(["GetEmbeddings", "StreamEmbeddings", "ListModels"]))
        if kind == "list":
            method, data = "ListModels", b""
        elif kind == "garbage":
            data = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).bytes(
                draw(st.integers(0, 64))
            )
        else:
            data = draw(st.sampled_from(OVERSIZED))
    call = Call(kind, method, data)
    timing = draw(st.sampled_from(["normal"] * 6 + ["short", "cancel"]))
    if timing == "short":
        call.timeout = draw(st.sampled_from([0.001, 0.005, 0.02, 0.05, 0.1]))
    elif timing == "cancel":
        call.cancel_after = draw(st.sampled_from([0.0, 0.001, 0.005, 0.02, None]))
        if method == "StreamEmbeddings" or call.cancel_after is None:
            call.cancel_chunks = draw(st.integers(0, 3)) if method == "StreamEmbeddings" else None
            if call.cancel_chunks is None and call.cancel_after is None:
                call.cancel_after = 0.0
    call.auth = draw(st.sampled_from(["valid"] * 9 + ["none", "wrong", "scope"]))
    return call


async def _send(channel: grpc.aio.Channel, call: Call) -> Outcome:
    """Send ``call`` and report what came back (client-side cancellation included)."""
    loop = asyncio.get_running_loop()
    path = SERVICE + call.method
    if call.method == "StreamEmbeddings":
        stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        rpc = stream(call.data, timeout=call.timeout, metadata=call.metadata)
    else:
        unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        rpc = unary(call.data, timeout=call.timeout, metadata=call.metadata)
    if call.cancel_after is not None:
        loop.call_later(call.cancel_after, rpc.cancel)
    outcome = Outcome(grpc.StatusCode.OK)
    try:
        if call.method == "StreamEmbeddings":
            if call.cancel_chunks == 0:
                rpc.cancel()
            async for chunk in rpc:
                outcome.chunks.append(chunk)
                if call.cancel_chunks is not None and len(outcome.chunks) >= call.cancel_chunks:
                    rpc.cancel()
                    break
        else:
            outcome.reply = await rpc
    except asyncio.CancelledError:  # the client cancelled the call (not this task)
        pass
    except grpc.aio.AioRpcError as err:
        return Outcome(err.code(), err.details() or "", chunks=outcome.chunks)
    outcome.code = await rpc.code()
    outcome.details = await rpc.details() or ""
    return outcome


class Expected:
    """The engine's rows for any (external IDs, fanouts, seed), computed once per key."""

    def __init__(self, evaluator: LayerwiseEvaluator, all_ids: np.ndarray) -> None:
        self.evaluator = evaluator
        self.all_ids = all_ids
        self.row = {int(v): i for i, v in enumerate(all_ids)}
        self.tables: dict[tuple[tuple[int, ...], int] | None, np.ndarray] = {}

    def rows(self, request: pb.GetEmbeddingsRequest) -> np.ndarray:
        fanouts = tuple(request.options.fanouts)
        key = None
        if fanouts and any(f != -1 for f in fanouts):
            key = (fanouts, request.options.seed if request.options.HasField("seed") else 0)
        if key not in self.tables:
            targets = torch.from_numpy(self.all_ids)
            kw = {} if key is None else {"fanouts": list(key[0]), "seed": key[1]}
            self.tables[key] = self.evaluator.evaluate(targets, **kw).numpy()
        return self.tables[key][[self.row[int(v)] for v in request.node_ids]]


def _check(call: Call, out: Outcome, expected: Expected, tokens: bool = False) -> None:
    """The contract of one answer (``tokens``: the server requires them); raises
    AssertionError naming the call."""
    what = (f"{call.kind} {call.method} ({len(call.data)} bytes, auth {call.auth}): "
            f"{out.code} {out.details[:200]!r}")  # fmt: skip
    assert out.code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), what
    assert len(out.details.encode()) <= MAX_DETAILS, what
    assert not any(t and t[4:20] in out.details for t in TOKENS.values()), what
    refused = REFUSED.get(call.auth) if tokens else None
    if out.code is grpc.StatusCode.CANCELLED:
        assert call.cancels, what  # only the client cancels
    elif refused is None or len(call.data) > RECEIVE_LIMIT:
        assert out.code in DOCUMENTED, what
    else:  # refused before anything else, whatever the bytes
        assert out.code in (refused, grpc.StatusCode.DEADLINE_EXCEEDED), what
        assert call.timeout < LONG_TIMEOUT_S or out.code is refused, what
        assert not out.chunks and out.reply is None, what
        return
    if out.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        assert call.timeout < LONG_TIMEOUT_S, f"server wedged? {what}"
    if len(call.data) > RECEIVE_LIMIT:  # refused by grpc before anything is decoded
        assert out.code in (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ), what
        return
    request_cls = {"ListModels": pb.ListModelsRequest, "GetModel": pb.GetModelRequest}.get(
        call.method, pb.GetEmbeddingsRequest
    )
    try:
        request = request_cls.FromString(call.data)
    except Exception:
        request = None
    if request is None:  # undecodable
        assert out.code in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ), what
        assert not out.chunks and out.reply is None, what
        return
    if call.method == "GetEmbeddings" and out.code is grpc.StatusCode.OK:
        reply = pb.GetEmbeddingsResponse.FromString(out.reply)
        assert reply.num_nodes == len(request.node_ids) and reply.dim == 5, what
        assert (reply.model, reply.model_version) == (MODEL, "1"), what
        got = decode_embeddings(reply.embeddings, reply.num_nodes, reply.dim)
        assert_exact(torch.from_numpy(got.copy()), torch.from_numpy(expected.rows(request)), what)
    elif call.method == "StreamEmbeddings" and (out.chunks or out.code is grpc.StatusCode.OK):
        chunks = [pb.EmbeddingChunk.FromString(c) for c in out.chunks]
        want = expected.rows(request)
        offset = 0
        for chunk in chunks:  # in order, no gaps, each equal to the engine
            assert chunk.offset == offset and chunk.num_rows >= 1, what
            assert chunk.num_nodes == len(request.node_ids) and chunk.dim == 5, what
            got = decode_embeddings(chunk.embeddings, chunk.num_rows, chunk.dim)
            part = want[offset : offset + chunk.num_rows]
            assert_exact(torch.from_numpy(got.copy()), torch.from_numpy(part), what)
            offset += chunk.num_rows
        if out.code is grpc.StatusCode.OK:
            assert offset == len(request.node_ids), what
    elif call.method == "GetModel" and out.code is grpc.StatusCode.OK:
        assert pb.ModelInfo.FromString(out.reply).name == MODEL == request.name, what
    elif call.method == "ListModels" and out.code is grpc.StatusCode.OK:
        assert [m.name for m in pb.ListModelsResponse.FromString(out.reply).models] == [MODEL]


@pytest.mark.parametrize("port", ["plaintext", "tls+tokens"])
def test_fuzz_front_end(port, request, evaluator, all_ids, records) -> None:
    """≥ 2,000 hostile and valid calls, 40 at a time: documented codes only, OK answers
    equal the engine, bounded messages, no error in the log; afterwards the server is
    healthy and answers a burst of normal requests promptly (no wedged batcher)."""
    secure = port == "tls+tokens"
    server = request.getfixturevalue("secure_fuzz_server" if secure else "fuzz_server")
    expected = Expected(evaluator, all_ids)
    loop = asyncio.new_event_loop()
    channel = loop.run_until_complete(_open(server.target, server.credentials))
    seen: dict[str, int] = {}
    started = time.perf_counter()

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate],  # no shrinking against a live server
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(batch=st.lists(calls(all_ids), min_size=CALLS_PER_EXAMPLE,
                          max_size=CALLS_PER_EXAMPLE))  # fmt: skip
    def fuzz(batch: list[Call]) -> None:
        outcomes = loop.run_until_complete(_send_all(channel, batch))
        for call, out in zip(batch, outcomes, strict=True):
            seen[out.code.name] = seen.get(out.code.name, 0) + 1
            _check(call, out, expected, tokens=secure)

    try:
        fuzz()
        fuzz_seconds = time.perf_counter() - started
        assert sum(seen.values()) >= 2000, seen
        reached = ["OK", "INVALID_ARGUMENT", "NOT_FOUND", "CANCELLED", "DEADLINE_EXCEEDED"]
        if secure:
            reached += ["UNAUTHENTICATED", "PERMISSION_DENIED"]
        for code in reached:
            assert seen.get(code, 0) > 0, seen  # the run reached every kind of answer
        # healthy and not wedged: a burst of normal requests is answered promptly
        for service in ("", "hopserve.v1.EmbeddingService", MODEL):
            status = loop.run_until_complete(_health(channel, service))
            assert status == health_pb2.HealthCheckResponse.SERVING, service
        burst = [
            Call("burst", method, pb.GetEmbeddingsRequest(
                model=MODEL, node_ids=_ids(all_ids, k, 10), options=pb.QueryOptions(
                    cache_policy=pb.CACHE_BYPASS, fanouts=[2, 2, 2] if k % 3 == 0 else [])
            ).SerializeToString(), timeout=BURST_S)
            for k in range(24) for method in ("GetEmbeddings", "StreamEmbeddings")
        ]  # fmt: skip
        t0 = time.perf_counter()
        answers = loop.run_until_complete(_send_all(channel, burst))
        assert [a.code for a in answers] == [grpc.StatusCode.OK] * len(burst), [
            (a.code, a.details) for a in answers if a.code is not grpc.StatusCode.OK
        ]
        for call, out in zip(burst, answers, strict=True):
            _check(call, out, expected, tokens=secure)
        assert time.perf_counter() - t0 < BURST_S
    finally:
        loop.run_until_complete(channel.close())
        loop.close()
    assert not records.floods(), records.floods()[:10]
    print(f"fuzz ({port}): {sum(seen.values())} calls in {fuzz_seconds:.1f}s: {seen}")


async def _send_all(channel: grpc.aio.Channel, batch: list[Call]) -> list[Outcome]:
    """Send every call of ``batch`` at once."""
    return list(await asyncio.gather(*(_send(channel, call) for call in batch)))


async def _health(channel: grpc.aio.Channel, service: str) -> int:
    """The health status of ``service``."""
    check = health_pb2_grpc.HealthStub(channel).Check
    reply = await check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


async def _open(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    if credentials is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        channel = grpc.aio.secure_channel(target, credentials)
    await asyncio.wait_for(channel.channel_ready(), 10)
    return channel
