"""A real ``AdminService`` on loopback whose graph RPCs go to a recording test double.

:class:`RecordingGraphs` stands in for the graph owner (another component): it records
each request and answers from it, or aborts once with an injected status.
:class:`AdminServer` serves the real servicer (no models) on its own event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import grpc.aio

from hopserve.config import HopserveConfig
from hopserve.proto.v1 import admin_pb2
from hopserve.rpc import add_service
from hopserve.server.admin import ADMIN_SERVICE, AdminService
from hopserve.server.metrics import Metrics
from hopserve.server.model_lifecycle import ModelLifecycle
from hopserve.server.models import ModelRegistry
from hopserve.server.workers import WorkerSet


class RecordingGraphs:
    """Stands in for the graph owner: records requests, answers from them."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.fail: tuple[grpc.StatusCode, str] | None = None

    async def _enter(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.requests.append(request)
        if self.fail is not None:
            code, message = self.fail
            self.fail = None
            await context.abort(code, message)

    async def update_graph(self, request, context):  # noqa: ANN001, ANN201
        await self._enter(request, context)
        return admin_pb2.UpdateGraphResponse(
            graph_seq=len(self.requests),
            graph_version="g1",
            nodes_added=len(request.add_nodes.node_ids),
            edges_added=len(request.add_edges.src),
            edges_removed=len(request.remove_edges.src),
            features_set=len(request.set_features.node_ids),
            replayed=request.idempotency_key == "seen",
        )

    async def compact_graph(self, request, context):  # noqa: ANN001, ANN201
        await self._enter(request, context)
        return admin_pb2.GraphInfo(path="/g", graph_version="g2", compacting=True,
                                   models=[request.model])  # fmt: skip

    async def get_graph(self, request, context):  # noqa: ANN001, ANN201
        await self._enter(request, context)
        if request.model != "sage":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} not found")
        return admin_pb2.GraphInfo(path="/g", graph_version="g1", graph_seq=3, num_nodes=10,
                                   num_edges=20, log_batches=3, models=["sage"])  # fmt: skip


class AdminServer:
    """A grpc.aio server with the real AdminService (no models) on its own loop."""

    def __init__(self, graphs: RecordingGraphs | None) -> None:
        self.graphs = graphs
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self.call(self._start)

    async def _start(self) -> int:
        models = ModelRegistry()
        lifecycle = ModelLifecycle(HopserveConfig(), models, None, WorkerSet([], {}))  # type: ignore[arg-type]
        self.server = grpc.aio.server()
        add_service(self.server, AdminService(lifecycle, Metrics(), self.graphs), ADMIN_SERVICE)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def call(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(30)

    def stop(self) -> None:
        self.call(lambda: self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"
