"""Blocking client: :class:`EmbeddingClient`.

Example::

    from hopserve.client import EmbeddingClient

    with EmbeddingClient("localhost:50051") as client:
        client.wait_until_ready(30)
        emb = client.get_embeddings("sage", [3, 1, 4])  # float32 [3, dim], request order
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt

from hopserve.client._base import EmbeddingClientBase
from hopserve.client._query import Deadline, Query
from hopserve.client.errors import from_rpc_error
from hopserve.client.results import EmbeddingResult, ModelInfo
from hopserve.proto.v1 import embedding_pb2 as pb

if TYPE_CHECKING:
    from hopserve.client.admin import EdgesArg, NodeRowsArg

__all__ = ["EmbeddingClient"]


class EmbeddingClient(EmbeddingClientBase):
    """Blocking client of ``hopserve.v1.EmbeddingService``; thread-safe.

    Constructor arguments: see :class:`~hopserve.client._base.EmbeddingClientBase`.
    """

    def _init_channel(self) -> None:
        self._open_channel(grpc)

    # -- embeddings -------------------------------------------------------------------

    def get_embeddings(
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
        """Embeddings of ``node_ids`` as a float32 ``[len(node_ids), dim]`` array.

        Args:
            model: Model name.
            node_ids: 1-D integer array-like of external node IDs (non-empty; duplicates
                allowed). Rows come back in this order.
            fanouts: Per-layer neighbour sampling (``fanouts[i]`` for layer ``i+1``,
                ``-1`` = all); None means exact full-neighbour evaluation.
            cache_policy: ``"use"``, ``"refresh"`` or ``"bypass"``.
            model_version: Model version; None means the latest.
            seed: Sampling seed in ``[0, 2**64)``, for reproducible sampled results.
            timeout: Deadline in seconds for the whole call; None uses the client's.
            node_type: On a graph with typed node sets (``ModelInfo.node_types``), the
                type ``node_ids`` belong to, each ID that type's own (``0..count-1``);
                None: store-wide IDs.

        Raises:
            InvalidArgumentError: Bad arguments (checked before sending) or rejected by
                the server. NotFoundError: unknown model. UnavailableError,
                ResourceExhaustedError: still failing after the retries.
                DeadlineExceededError: the deadline passed. HopserveError: anything else.
        """
        return self.get_embeddings_with_info(
            model,
            node_ids,
            fanouts=fanouts,
            cache_policy=cache_policy,
            model_version=model_version,
            seed=seed,
            timeout=timeout,
            node_type=node_type,
        ).embeddings

    def get_embeddings_with_info(
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
        """Like :meth:`get_embeddings`, plus versions, server timing and cache hits.

        ``add_nodes=(ids, features)`` and ``add_edges=(src, dst)`` are a request-scoped
        graph delta (cold start): rows are exact for graph + delta, nothing is stored or
        cached, and the new IDs may be asked for. On a graph with edge columns the added
        edges carry ``edge_weights`` ``[len(src)]`` / ``edge_features`` ``[len(src), d_e]``
        and, on a graph with typed edges, ``edge_relations`` (a relation name per edge; as
        :meth:`AdminClient.update_graph`). On a graph whose node types have their own IDs,
        ``add_node_type`` is the type of ``add_nodes`` (new IDs of it), and ``node_type``
        lets ``node_ids`` name nodes of a type, the delta's new ones included.
        ``footprint=True`` answers, per row, what computing it touched (:class:`Footprint`).

        Calls over ``max_nodes_per_request`` IDs run as consecutive GetEmbeddings RPCs
        pinned to the first answer's model version; their stats are summed.
        """
        query = self._query(
            model, node_ids, fanouts, cache_policy, model_version, seed, timeout,
            add_nodes, add_edges, footprint, edge_weights, edge_features, edge_relations,
            node_type, add_node_type,
        )  # fmt: skip
        while not query.finished:
            request = query.next_request()
            query.add_response(self._call("GetEmbeddings", request, query.deadline))
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
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Stream embeddings of a large target set as ``(row_offset, rows)`` pieces.

        Pieces arrive in request order and tile ``[0, len(node_ids))``; ``rows`` is a
        writable float32 ``[k, dim]`` array for ``node_ids[row_offset : row_offset + k]``.
        Arguments are validated at once; ``timeout`` bounds the whole stream. A stream
        that breaks with a retryable status resumes after the last row received.
        Stopping iteration early cancels the RPC.

        Raises:
            The exceptions of :meth:`get_embeddings`, raised while iterating.
        """
        query = self._query(model, node_ids, fanouts, cache_policy, model_version, seed, timeout)
        return self._stream(query)

    def _stream(self, query: Query) -> Iterator[tuple[int, np.ndarray]]:
        attempt = 0
        while not query.finished:
            request = query.next_request()
            call = self._stub.StreamEmbeddings(
                request, timeout=query.deadline.rpc_timeout(), metadata=self._metadata
            )
            try:
                for chunk in call:
                    yield query.add_chunk(chunk)
                    attempt = 0  # progress: the next failure starts a fresh backoff
                query.end_stream()
            except grpc.RpcError as err:
                delay = self._retry_delay(err, attempt, query.deadline)
                if delay is None:
                    raise from_rpc_error(err, f"StreamEmbeddings({query.describe()})") from None
                time.sleep(delay)
                attempt += 1
            finally:
                call.cancel()

    # -- models and health ------------------------------------------------------------

    def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        """All models the server serves, sorted by name then version."""
        deadline = self._deadline(timeout)
        resp = self._call("ListModels", pb.ListModelsRequest(), deadline)
        return [ModelInfo.from_proto(m) for m in resp.models]

    def get_model(
        self, name: str, version: str | int | None = None, *, timeout: float | None = None
    ) -> ModelInfo:
        """Metadata of one model (latest version if ``version`` is None).

        Raises:
            NotFoundError: The model or version is not served.
        """
        deadline = self._deadline(timeout)
        request = self._model_request(name, version)
        return ModelInfo.from_proto(self._call("GetModel", request, deadline))

    def health(self, model: str | None = None, *, timeout: float | None = None) -> bool:
        """Whether the server (or ``model``) reports SERVING via ``grpc.health.v1``.

        One probe, no retries. Unreachable server, unknown model and timeout give False;
        other failures (e.g. UNIMPLEMENTED) raise :class:`HopserveError`.
        """
        deadline = self._deadline(timeout)
        request = self._health_request(model)
        try:
            resp = self._health_check(request, timeout=deadline.rpc_timeout())
        except grpc.RpcError as err:
            return self._health_failure(err)
        return self._serving(resp)

    def wait_until_ready(self, timeout: float | None = None, *, model: str | None = None) -> None:
        """Block until :meth:`health` is True, polling with backoff.

        Args:
            timeout: Seconds to wait; None uses the client's default timeout.
            model: Wait for this model instead of the server.

        Raises:
            DeadlineExceededError: Not ready in time.
        """
        deadline = self._deadline(timeout)
        attempt = 0
        while not self.health(model, timeout=self._probe_timeout(deadline, model)):
            time.sleep(self._poll_delay(attempt, deadline, model))
            attempt += 1

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; in-flight calls are cancelled. Idempotent."""
        self._closed = True
        self._channel.close()

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------

    def _call(self, method: str, request: Any, deadline: Deadline) -> Any:
        """Run unary RPC ``method`` of the stub with the retry policy; map failures."""
        rpc = getattr(self._stub, method)
        attempt = 0
        while True:
            try:
                return rpc(request, timeout=deadline.rpc_timeout(), metadata=self._metadata)
            except grpc.RpcError as err:
                delay = self._retry_delay(err, attempt, deadline)
                if delay is None:
                    raise from_rpc_error(err, method) from None
            time.sleep(delay)
            attempt += 1
