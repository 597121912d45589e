"""The ``hopserve.v1.AdminService`` servicer: model lifecycle and graph updates (scope ``admin``).

Model RPCs are :class:`~hopserve.server.model_lifecycle.ModelLifecycle` calls; graph RPCs
go to an optional ``graphs`` handler (the living-graph owner), an object with coroutine
methods ``update_graph``, ``compact_graph`` and ``get_graph`` taking ``(request,
context)`` and returning the response message; without one they answer UNIMPLEMENTED.

Every failure is answered with its status once, here (:func:`hopserve.server.errors.to_status`):
NOT_FOUND unknown model or version, INVALID_ARGUMENT a bad config entry or argument,
ALREADY_EXISTS a version loaded twice, FAILED_PRECONDITION a change that conflicts with
what is served (unloading the default while other versions remain, routing traffic to a
version that is not ready, a failed self-check), UNAVAILABLE while shutting down. Every
call is counted in ``hopserve_requests_total`` like the embedding RPCs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
import grpc.aio

from hopserve.logs import rate_limited
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.server.errors import ShuttingDownError, outcome_label, quote, to_status
from hopserve.server.metrics import Metrics
from hopserve.server.model_lifecycle import ModelLifecycle

__all__ = ["ADMIN_SERVICE", "AdminService", "GraphHandler"]

logger = rate_limited(__name__)

ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
"""Descriptor of ``hopserve.v1.AdminService``."""

_UNKNOWN_MODEL = "_unknown"


class GraphHandler(Protocol):
    """What the graph RPCs are delegated to (the living-graph owner)."""

    async def update_graph(
        self, request: admin_pb2.UpdateGraphRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateGraphResponse: ...

    async def compact_graph(
        self, request: admin_pb2.CompactGraphRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GraphInfo: ...

    async def get_graph(
        self, request: admin_pb2.GetGraphRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GraphInfo: ...


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    """Administrative RPCs of a front-end.

    Args:
        lifecycle: Loads, switches and unloads model versions.
        metrics: Where calls are counted.
        graphs: Handler of the graph RPCs; ``None`` answers them UNIMPLEMENTED.
    """

    def __init__(
        self, lifecycle: ModelLifecycle, metrics: Metrics, graphs: GraphHandler | None = None
    ) -> None:
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.graphs = graphs
        self._closing = False

    def stop_accepting(self) -> None:
        """Answer new calls UNAVAILABLE from now on (shutdown)."""
        self._closing = True

    # ------------------------------------------------------------------ models

    async def LoadModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.LoadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        """Load, self-check and serve a version (default when ``make_default``)."""
        async with self._rpc("LoadModel", "", context):
            cfg = self.lifecycle.parse(request.config)
            model = await self.lifecycle.load(cfg, make_default=request.make_default)
            return self.lifecycle.models.info(model)

    async def UnloadModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.UnloadModelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UnloadModelResponse:
        """Drain and unload a version that is not the default (or the name's last one)."""
        async with self._rpc("UnloadModel", request.name, context):
            model, drained = await self.lifecycle.unload(request.name, request.version)
            return admin_pb2.UnloadModelResponse(version=model.version, drained_requests=drained)

    async def SetDefaultModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.SetDefaultModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        """Make a ready version the default, optionally with a canary split."""
        async with self._rpc("SetDefaultModel", request.name, context):
            model = await self.lifecycle.set_default(
                request.name,
                request.version,
                canary=request.canary_version,
                percent=int(request.canary_percent),
            )
            return self.lifecycle.models.info(model)

    # ------------------------------------------------------------------ graphs

    async def UpdateGraph(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.UpdateGraphRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateGraphResponse:
        """Delegated to ``graphs.update_graph``."""
        async with self._rpc("UpdateGraph", request.model, context):
            return await self._graphs("UpdateGraph").update_graph(request, context)

    async def CompactGraph(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.CompactGraphRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GraphInfo:
        """Delegated to ``graphs.compact_graph``."""
        async with self._rpc("CompactGraph", request.model, context):
            return await self._graphs("CompactGraph").compact_graph(request, context)

    async def GetGraph(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.GetGraphRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GraphInfo:
        """Delegated to ``graphs.get_graph``."""
        async with self._rpc("GetGraph", request.model, context):
            return await self._graphs("GetGraph").get_graph(request, context)

    def _graphs(self, method: str) -> Any:
        if self.graphs is None:
            raise _Unimplemented(f"{method}: graph updates are not enabled on this server")
        return self.graphs

    # ------------------------------------------------------------------ edge

    @contextlib.asynccontextmanager
    async def _rpc(
        self, method: str, model_name: str, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[None]:
        """Count the call and answer any exception with its status (once, here); an
        abort the graph handler sent itself passes through unchanged."""
        label = model_name if model_name in self.lifecycle.models else _UNKNOWN_MODEL
        if not model_name:
            label = ""
        start = time.perf_counter()

        def record(code: grpc.StatusCode | None) -> None:
            seconds = time.perf_counter() - start
            self.metrics.observe_request(method, label, outcome_label(code), seconds)

        try:
            if self._closing:
                raise ShuttingDownError("the server is shutting down")
            yield
        except grpc.aio.AbortError:
            record(context.code() or grpc.StatusCode.UNKNOWN)
            raise
        except _Unimplemented as exc:
            record(grpc.StatusCode.UNIMPLEMENTED)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc))
        except Exception as exc:
            code, message = to_status(exc, where=f"{method} {quote(model_name)}")
            record(code)
            if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
                logger.warning("%s %s: %s", method, quote(model_name), message)
            await context.abort(code, message)
        else:
            record(None)


class _Unimplemented(Exception):
    """A graph RPC without a graph handler."""
