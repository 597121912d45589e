"""Fixtures of the client tests: a fake EmbeddingService on a real loopback gRPC server.

The fake stands in for the front-end's business logic only; the transport, the clients
and the status codes are real. Row ``i`` of any answer is ``node_id * [1, 2, ..., dim]``
(:meth:`FakeEmbeddingService.rows`), so a test can compute what it expects from the IDs
it sent. Tests reach everything through fixtures (``fake``, ``start_fake``,
``free_port``, ``make_client``), which works under any pytest import mode.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hopserve.client import AsyncEmbeddingClient, EmbeddingClient
from hopserve.proto.tensors import encode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.proto.v1 import embedding_pb2_grpc
from hopserve.testing import free_port

MODEL = "sage"
DIM = 4
NUM_LAYERS = 2


@dataclass
class Failure:
    """Abort the next ``times`` calls of ``method`` (any method if None) with ``code``."""

    code: grpc.StatusCode
    times: int = 1
    method: str | None = None
    details: str = "injected failure"


@dataclass
class FakeEmbeddingService(embedding_pb2_grpc.EmbeddingServiceServicer):
    """Deterministic EmbeddingService with knobs for failure injection."""

    dim: int = DIM
    delay: float = 0.0  # seconds every GetEmbeddings / stream waits before answering
    chunk_rows: int = 3  # rows per streamed chunk
    break_stream_after: int | None = None  # once: UNAVAILABLE after this many chunks
    corrupt: bool = False  # answer one byte short
    failures: list[Failure] = field(default_factory=list)
    requests: list[tuple[str, object]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- test API -----------------------------------------------------------------
    model = MODEL

    def rows(self, ids: object) -> np.ndarray:
        """What the fake answers for ``ids``: row ``i`` is ``ids[i] * [1..dim]``, float32."""
        ids = np.asarray(ids, dtype=np.int64)
        return (ids[:, None] * np.arange(1, self.dim + 1)).astype(np.float32)

    def fail(
        self,
        code: grpc.StatusCode,
        times: int = 1,
        method: str | None = None,
        details: str = "injected failure",
    ) -> None:
        """Abort the next ``times`` calls of ``method`` (any if None) with ``code``."""
        self.failures.append(Failure(code, times, method, details))

    def calls(self, method: str) -> list:
        """Requests received so far by ``method``, in order."""
        with self.lock:
            return [r for m, r in self.requests if m == method]

    # -- helpers ------------------------------------------------------------------
    def _enter(self, method: str, request: object, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.requests.append((method, request))
            for failure in self.failures:
                if failure.times > 0 and failure.method in (None, method):
                    failure.times -= 1
                    context.abort(failure.code, failure.details)

    def _check(self, request: pb.GetEmbeddingsRequest, context: grpc.ServicerContext) -> np.ndarray:
        if request.model != MODEL:
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} not found")
        if request.model_version not in ("", "3"):
            context.abort(grpc.StatusCode.NOT_FOUND, f"version {request.model_version!r}")
        fanouts = list(request.options.fanouts)
        if fanouts and len(fanouts) != NUM_LAYERS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"fanouts has {len(fanouts)} entries, model has {NUM_LAYERS} layers",
            )
        ids = np.asarray(request.node_ids, dtype=np.int64)
        if (ids < 0).any():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown node id {ids[ids < 0][0]}")
        if self.delay:
            time.sleep(self.delay)
        return ids

    def _payload(self, ids: np.ndarray) -> bytes:
        data = encode_embeddings(self.rows(ids))
        return data[:-1] if self.corrupt else data

    # -- service --------------------------------------------------------------------
    def GetEmbeddings(self, request, context):  # noqa: N802 (gRPC method name)
        self._enter("GetEmbeddings", request, context)
        ids = self._check(request, context)
        return pb.GetEmbeddingsResponse(
            dim=self.dim,
            dtype=pb.DTYPE_FLOAT32,
            embeddings=self._payload(ids),
            num_nodes=len(ids),
            model=MODEL,
            model_version="3",
            graph_version="g1",
            timing=pb.StageTiming(compute=0.5, total=1.0, layer_compute=[0.2, 0.3]),
            cache_hits=int((ids % 2 == 0).sum()),
        )

    def StreamEmbeddings(self, request, context):  # noqa: N802
        self._enter("StreamEmbeddings", request, context)
        ids = self._check(request, context)
        for k, offset in enumerate(range(0, len(ids), self.chunk_rows)):
            if self.break_stream_after is not None and k == self.break_stream_after:
                self.break_stream_after = None
                context.abort(grpc.StatusCode.UNAVAILABLE, "stream broke")
            part = ids[offset : offset + self.chunk_rows]
            last = offset + len(part) == len(ids)
            yield pb.EmbeddingChunk(
                offset=offset,
                num_rows=len(part),
                embeddings=self._payload(part),
                dim=self.dim,
                dtype=pb.DTYPE_FLOAT32,
                num_nodes=len(ids),
                model=MODEL,
                model_version="3",
                graph_version="g1",
                cache_hits=0,
                timing=pb.StageTiming(total=1.0) if last else None,
            )

    def _model_info(self) -> pb.ModelInfo:
        return pb.ModelInfo(
            name=MODEL,
            version="3",
            dim=self.dim,
            num_layers=NUM_LAYERS,
            graph_num_nodes=100,
            graph_num_edges=400,
            graph_version="g1",
            ready=True,
            blocks=[
                pb.BlockInfo(layer=1, kind="SAGEConv", in_dim=8, out_dim=16),
                pb.BlockInfo(layer=2, kind="SAGEConv", in_dim=16, out_dim=self.dim),
            ],
            description="two-layer GraphSAGE",
            dtype=pb.DTYPE_FLOAT32,
        )

    def ListModels(self, request, context):  # noqa: N802
        self._enter("ListModels", request, context)
        return pb.ListModelsResponse(models=[self._model_info()])

    def GetModel(self, request, context):  # noqa: N802
        self._enter("GetModel", request, context)
        if request.name != MODEL:
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.name!r} not found")
        return self._model_info()


@dataclass
class Running:
    """A started fake server."""

    server: grpc.Server
    service: FakeEmbeddingService
    health: health.HealthServicer
    target: str


def _start_server(
    service: FakeEmbeddingService, port: int = 0, health_service: bool = True
) -> Running:
    """Serve ``service`` (and grpc.health.v1) on ``127.0.0.1:port`` (0: any free port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    embedding_pb2_grpc.add_EmbeddingServiceServicer_to_server(service, server)
    health_servicer = health.HealthServicer()
    if health_service:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", MODEL):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return Running(server, service, health_servicer, f"127.0.0.1:{bound}")


class BlockingAsync:
    """Drives an :class:`AsyncEmbeddingClient` from sync test code on a private loop.

    Lets one test body exercise both clients: coroutine methods are run to completion
    and ``stream_embeddings`` is drained into a list iterator.
    """

    def __init__(self, client: AsyncEmbeddingClient) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str):
        attr = getattr(self.client, name)
        if name == "stream_embeddings":

            def drain(*args, **kwargs):
                async def run():
                    return [piece async for piece in attr(*args, **kwargs)]

                return iter(self.loop.run_until_complete(run()))

            return drain
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self.loop.run_until_complete(attr(*args, **kwargs))
        return attr

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())

    def shutdown(self) -> None:
        self.close()
        self.loop.close()


@pytest.fixture
def start_fake() -> Iterator[Callable[..., Running]]:
    """Factory ``start(port=0, health_service=True, **service_fields) -> Running``.

    Thread-safe (tests start servers from timers); every server is stopped after the test.
    """
    started: list[Running] = []
    lock = threading.Lock()

    def start(port: int = 0, health_service: bool = True, **fields) -> Running:
        running = _start_server(FakeEmbeddingService(**fields), port, health_service)
        with lock:
            started.append(running)
        return running

    yield start
    for running in started:
        running.server.stop(grace=None)


@pytest.fixture
def fake(start_fake: Callable[..., Running]) -> Running:
    """A running fake server with default settings."""
    return start_fake()


@pytest.fixture(name="free_port")
def free_port_fixture() -> int:
    """A loopback port nothing listens on (free a moment ago)."""
    return free_port()


@pytest.fixture(params=["sync", "async"])
def make_client(request: pytest.FixtureRequest) -> Iterator[Callable[..., object]]:
    """Factory of blocking clients of the parametrized kind; all closed after the test."""
    made: list = []

    def make(target: str, **kwargs):
        if request.param == "sync":
            client = EmbeddingClient(target, **kwargs)
        else:
            client = BlockingAsync(AsyncEmbeddingClient(target, **kwargs))
        made.append(client)
        return client

    yield make
    for client in made:
        getattr(client, "shutdown", client.close)()
