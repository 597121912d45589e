"""Asyncio client: :class:`AsyncEmbeddingClient`, the twin of :class:`EmbeddingClient`.

Same method names, arguments, defaults and errors as the blocking client (a test keeps
them equal); methods are coroutines and :meth:`AsyncEmbeddingClient.stream_embeddings`
returns an async iterator. See :class:`hopserve.client.EmbeddingClient` for the
documentation of each method.

Example::

    async with AsyncEmbeddingClient("localhost:50051") as client:
        emb = await client.get_embeddings("sage", [3, 1, 4])
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from hopserve.client._base import EmbeddingClientBase
from hopserve.client._query import Deadline, Query
from hopserve.client.errors import from_rpc_error
from hopserve.client.results import EmbeddingResult, ModelInfo
from hopserve.proto.v1 import embedding_pb2 as pb

if TYPE_CHECKING:
    from hopserve.client.admin import EdgesArg, NodeRowsArg

__all__ = ["AsyncEmbeddingClient"]


class AsyncEmbeddingClient(EmbeddingClientBase):
    """Asyncio client of ``hopserve.v1.EmbeddingService`` (see :class:`EmbeddingClient`).

    The gRPC channel is opened on first use and bound to that event loop; use one client
    per event loop.
    """

    def _init_channel(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure_channel(self) -> None:
        loop = asyncio.get_running_loop()
        if self._channel is not None:
            if loop is not self._loop:
                raise RuntimeError(
                    f"{type(self).__name__} is bound to the event loop it was first used in"
                )
            return
        self._open_channel(grpc.aio)
        self._loop = loop

    # -- embeddings -------------------------------------------------------------------

    async def get_embeddings(
        self,
        model: str,
        node_ids: npt.ArrayLike,
        *,
        fanouts: Sequence[int] | None = None,
        cache_policy: str = "use",
        model_version: str | int | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        node_type: str | None = None,
    ) -> np.ndarray:
        """See :meth:`EmbeddingClient.get_embeddings`."""
        result = await self.get_embeddings_with_info(
            model,
            node_ids,
            fanouts=fanouts,
            cache_policy=cache_policy,
            model_version=model_version,
            seed=seed,
            timeout=timeout,
            node_type=node_type,
        )
        return result.embeddings

    async def get_embeddings_with_info(
        self,
        model: str,
        node_ids: npt.ArrayLike,
        *,
        fanouts: Sequence[int] | None = None,
        cache_policy: str = "use",
        model_version: str | int | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        add_nodes: NodeRowsArg | None = None,
        add_edges: EdgesArg | None = None,
        footprint: bool = False,
        edge_weights: npt.ArrayLike | None = None,
        edge_features: npt.ArrayLike | None = None,
        edge_relations: Sequence[str] | None = None,
        node_type: str | None = None,
        add_node_type: str | None = None,
    ) -> EmbeddingResult:
        """See :meth:`EmbeddingClient.get_embeddings_with_info`."""
        query = self._query(
            model, node_ids, fanouts, cache_policy, model_version, seed, timeout,
            add_nodes, add_edges, footprint, edge_weights, edge_features, edge_relations,
            node_type, add_node_type,
        )  # fmt: skip
        while not query.finished:
            request = query.next_request()
            query.add_response(await self._call("GetEmbeddings", request, query.deadline))
        return query.result()

    def stream_embeddings(
        self,
        model: str,
        node_ids: npt.ArrayLike,
        *,
        fanouts: Sequence[int] | None = None,
        cache_policy: str = "use",
        model_version: str | int | None = None,
        seed: int | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[tuple[int, np.ndarray]]:
        """See :meth:`EmbeddingClient.stream_embeddings`; use with ``async for``."""
        query = self._query(model, node_ids, fanouts, cache_policy, model_version, seed, timeout)
        return self._stream(query)

    async def _stream(self, query: Query) -> AsyncIterator[tuple[int, np.ndarray]]:
        attempt = 0
        while not query.finished:
            request = query.next_request()
            call = self._stub.StreamEmbeddings(
                request, timeout=query.deadline.rpc_timeout(), metadata=self._metadata
            )
            try:
                async for chunk in call:
                    yield query.add_chunk(chunk)
                    attempt = 0  # progress: the next failure starts a fresh backoff
                query.end_stream()
            except grpc.RpcError as err:
                delay = self._retry_delay(err, attempt, query.deadline)
                if delay is None:
                    raise from_rpc_error(err, f"StreamEmbeddings({query.describe()})") from None
                await asyncio.sleep(delay)
                attempt += 1
            finally:
                call.cancel()

    # -- models and health ------------------------------------------------------------

    async def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        """See :meth:`EmbeddingClient.list_models`."""
        deadline = self._deadline(timeout)
        resp = await self._call("ListModels", pb.ListModelsRequest(), deadline)
        return [ModelInfo.from_proto(m) for m in resp.models]

    async def get_model(
        self, name: str, version: str | int | None = None, *, timeout: float | None = None
    ) -> ModelInfo:
        """See :meth:`EmbeddingClient.get_model`."""
        deadline = self._deadline(timeout)
        request = self._model_request(name, version)
        return ModelInfo.from_proto(await self._call("GetModel", request, deadline))

    async def health(self, model: str | None = None, *, timeout: float | None = None) -> bool:
        """See :meth:`EmbeddingClient.health`."""
        deadline = self._deadline(timeout)
        request = self._health_request(model)
        try:
            resp = await self._health_check(request, timeout=deadline.rpc_timeout())
        except grpc.RpcError as err:
            return self._health_failure(err)
        return self._serving(resp)

    async def wait_until_ready(
        self, timeout: float | None = None, *, model: str | None = None
    ) -> None:
        """See :meth:`EmbeddingClient.wait_until_ready`."""
        deadline = self._deadline(timeout)
        attempt = 0
        while not await self.health(model, timeout=self._probe_timeout(deadline, model)):
            await asyncio.sleep(self._poll_delay(attempt, deadline, model))
            attempt += 1

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """See :meth:`EmbeddingClient.close`."""
        self._closed = True
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> AsyncEmbeddingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- internals --------------------------------------------------------------------

    async def _call(self, method: str, request: Any, deadline: Deadline) -> Any:
        """Run unary RPC ``method`` of the stub with the retry policy; map failures."""
        rpc = getattr(self._stub, method)
        attempt = 0
        while True:
            try:
                return await rpc(request, timeout=deadline.rpc_timeout(), metadata=self._metadata)
            except grpc.RpcError as err:
                delay = self._retry_delay(err, attempt, deadline)
                if delay is None:
                    raise from_rpc_error(err, method) from None
            await asyncio.sleep(delay)
            attempt += 1
