"""Admin clients: :class:`AdminClient` (blocking) and :class:`AsyncAdminClient` (asyncio).

The two clients of ``hopserve.v1.AdminService`` (every call needs a token with scope
``admin``): graph updates (:meth:`~AdminClient.update_graph`,
:meth:`~AdminClient.compact_graph`, :meth:`~AdminClient.get_graph`) and model versions
(:meth:`~AdminClient.load_model`, :meth:`~AdminClient.set_default_model`,
:meth:`~AdminClient.unload_model`). Same method names, arguments, defaults and errors
(a test keeps them equal); they share :class:`AdminClientBase`: connection options,
argument checks and request builders, the retry policy. Arguments are checked before
anything is sent (:class:`InvalidArgumentError` naming the bad value); every gRPC error
becomes a :class:`~hopserve.client.errors.HopserveError` subclass.

Retries: read-only and idempotent calls (``get_graph``, ``set_default_model``, and
``update_graph`` with an ``idempotency_key``) follow the embedding clients' policy; the
others are retried only when the server refused them before running them (a rate
limit's RESOURCE_EXHAUSTED), so a load, unload or update is never applied twice.

Example::

    from hopserve.client import AdminClient

    with AdminClient("localhost:50051", token=admin_token) as admin:
        admin.load_model({"name": "sage", "version": "2", "entrypoint": "m:SAGE",
                          "weights": "sage-v2.pt", "graph": "graph"}, make_default=True)
        admin.unload_model("sage", "1")
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from hopserve.client._base import EmbeddingClientBase
from hopserve.client._checks import check_int, check_model
from hopserve.client._query import Deadline
from hopserve.client.errors import InvalidArgumentError, from_rpc_error, rpc_status
from hopserve.client.results import ModelInfo
from hopserve.proto.tensors import EMBEDDING_DTYPE
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc
from hopserve.proto.v1 import embedding_pb2 as pb

__all__ = [
    "AdminClient",
    "AdminClientBase",
    "AsyncAdminClient",
    "GraphInfo",
    "GraphUpdateResult",
    "UnloadResult",
]

_INT64 = np.iinfo(np.int64)
MAX_IDEMPOTENCY_KEY = 128

NodeRowsArg = tuple[npt.ArrayLike, npt.ArrayLike]
"""``(node_ids, features)``: 1-D integer IDs and a ``[len(ids), dim]`` float array."""
EdgesArg = tuple[npt.ArrayLike, npt.ArrayLike]
"""``(src, dst)``: 1-D integer arrays of equal length, edge ``i`` is ``src[i] -> dst[i]``."""


@dataclass(frozen=True)
class GraphUpdateResult:
    """Answer of :meth:`AdminClient.update_graph` (``hopserve.v1.UpdateGraphResponse``).

    Attributes:
        graph_seq: Graph sequence after the batch.
        graph_version: Version of the base store the sequence counts from.
        nodes_added: Nodes added by the batch.
        edges_added: Edges added.
        edges_removed: Edges removed (every copy of each listed pair).
        features_set: Feature rows replaced.
        rows_invalidated: Cached rows the batch could change (invalidated).
        replayed: The idempotency key had been applied already; nothing was applied now.
        num_nodes: Nodes in the graph after the batch.
        num_edges: Edges after the batch.
    """

    graph_seq: int
    graph_version: str
    nodes_added: int = 0
    edges_added: int = 0
    edges_removed: int = 0
    features_set: int = 0
    rows_invalidated: int = 0
    replayed: bool = False
    num_nodes: int = 0
    num_edges: int = 0


@dataclass(frozen=True)
class GraphInfo:
    """State of a served graph (``hopserve.v1.GraphInfo``).

    Attributes:
        path: Folder of the graph store.
        graph_version: Version of the base store.
        graph_seq: Current graph sequence.
        base_seq: Sequence folded into the base by the last compaction (0 = none).
        log_batches: Update batches in the log beyond the base.
        log_bytes: Bytes of the update log.
        num_nodes: Nodes now.
        num_edges: Edges now.
        models: Models served on this graph.
        compacting: A compaction is running.
        relations: Relation names of typed edges, by id (empty: untyped).
    """

    path: str
    graph_version: str
    graph_seq: int = 0
    base_seq: int = 0
    log_batches: int = 0
    log_bytes: int = 0
    num_nodes: int = 0
    num_edges: int = 0
    models: list[str] = field(default_factory=list)
    compacting: bool = False
    relations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UnloadResult:
    """Answer of :meth:`AdminClient.unload_model`.

    Attributes:
        version: The version unloaded.
        drained_requests: Requests in flight when the unload began (all answered).
    """

    version: str
    drained_requests: int


class AdminClientBase(EmbeddingClientBase):
    """Connection options, argument checks, request builders and retry policy of both
    admin clients.

    Args:
        target: Server address, ``"host:port"``.
        timeout: Default deadline of one call in seconds (loading a model takes a while:
            300 by default); None waits forever.
        max_retries, backoff_base, backoff_max, channel_options, credentials, tls,
        root_certificates, client_certificate, client_key, token: As for
            :class:`~hopserve.client.EmbeddingClient`; the token needs scope ``admin``.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 300.0,
        max_retries: int = 4,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        tls: bool = False,
        root_certificates: str | Path | bytes | None = None,
        client_certificate: str | Path | bytes | None = None,
        client_key: str | Path | bytes | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(
            target,
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            channel_options=channel_options,
            credentials=credentials,
            tls=tls,
            root_certificates=root_certificates,
            client_certificate=client_certificate,
            client_key=client_key,
            token=token,
        )

    def _open_channel(self, channels: Any) -> None:
        super()._open_channel(channels)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)

    # -- request builders -------------------------------------------------------------

    @staticmethod
    def _update_request(
        model: str,
        add_nodes: NodeRowsArg | None,
        add_edges: EdgesArg | None,
        remove_edges: EdgesArg | None,
        set_features: NodeRowsArg | None,
        idempotency_key: str | None,
        edge_weights: npt.ArrayLike | None = None,
        edge_features: npt.ArrayLike | None = None,
        edge_relations: Sequence[str] | None = None,
        remove_relations: Sequence[str] | None = None,
        set_node_type: str | None = None,
        add_node_type: str | None = None,
    ) -> admin_pb2.UpdateGraphRequest:
        """The request of :meth:`AdminClient.update_graph` (checks every argument)."""
        request = admin_pb2.UpdateGraphRequest(model=check_model(model))
        parts = 0
        for name, value in (("add_nodes", add_nodes), ("set_features", set_features)):
            if value is not None:
                getattr(request, name).CopyFrom(node_rows(name, value))
                parts += 1
        edge_data = (edge_weights, edge_features, edge_relations)
        if add_edges is None and any(v is not None for v in edge_data):
            raise InvalidArgumentError(
                "edge_weights / edge_features / edge_relations need add_edges"
            )
        if add_edges is not None:
            request.add_edges.CopyFrom(edge_list("add_edges", add_edges, *edge_data))
            parts += 1
        if remove_edges is None and remove_relations is not None:
            raise InvalidArgumentError("remove_relations need remove_edges")
        if remove_edges is not None:
            request.remove_edges.CopyFrom(
                edge_list("remove_edges", remove_edges, relations=remove_relations)
            )
            parts += 1
        for arg, name, rows, value in (
            ("set_node_type", "set_features", set_features, set_node_type),
            ("add_node_type", "add_nodes", add_nodes, add_node_type),
        ):
            if value is None:
                continue
            if rows is None:
                raise InvalidArgumentError(f"{arg} needs {name}")
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"{arg} must be a non-empty string, got {value!r}")
            getattr(request, name).node_type = value
        if not parts:
            raise InvalidArgumentError(
                "update_graph needs at least one of add_nodes, add_edges, remove_edges, "
                "set_features"
            )
        if idempotency_key is not None:
            request.idempotency_key = check_idempotency_key(idempotency_key)
        return request

    @staticmethod
    def _load_request(
        config: str | Mapping[str, Any], make_default: bool
    ) -> admin_pb2.LoadModelRequest:
        if not isinstance(make_default, bool):
            raise InvalidArgumentError(f"make_default must be a bool, got {make_default!r}")
        return admin_pb2.LoadModelRequest(config=model_entry(config), make_default=make_default)

    @staticmethod
    def _unload_request(name: str, version: str | int) -> admin_pb2.UnloadModelRequest:
        return admin_pb2.UnloadModelRequest(
            name=check_model(name), version=check_version_given("version", version)
        )

    @staticmethod
    def _default_request(
        name: str, version: str | int, canary_version: str | int, canary_percent: int
    ) -> admin_pb2.SetDefaultModelRequest:
        version = check_version_given("version", version)
        canary = (
            ""
            if canary_version in ("", None)
            else check_version_given("canary_version", canary_version)
        )
        percent = check_int("canary_percent", canary_percent)
        if not 0 <= percent <= 100:
            raise InvalidArgumentError(f"canary_percent must be 0..100, got {percent}")
        if bool(canary) != bool(percent):
            raise InvalidArgumentError(
                "canary_version and canary_percent go together (a version and 1..100), got "
                f"canary_version={canary!r}, canary_percent={percent}"
            )
        if canary == version:
            raise InvalidArgumentError(f"canary_version {canary!r} is the default version itself")
        return admin_pb2.SetDefaultModelRequest(
            name=check_model(name), version=version, canary_version=canary, canary_percent=percent
        )

    # -- answers ----------------------------------------------------------------------

    @staticmethod
    def _update_result(msg: admin_pb2.UpdateGraphResponse) -> GraphUpdateResult:
        return GraphUpdateResult(
            **{f: getattr(msg, f) for f in GraphUpdateResult.__dataclass_fields__}
        )

    @staticmethod
    def _graph_info(msg: admin_pb2.GraphInfo) -> GraphInfo:
        values = {f: getattr(msg, f) for f in GraphInfo.__dataclass_fields__}
        values["models"] = list(msg.models)
        values["relations"] = list(msg.relations)
        return GraphInfo(**values)

    @staticmethod
    def _unload_result(msg: admin_pb2.UnloadModelResponse) -> UnloadResult:
        return UnloadResult(msg.version, int(msg.drained_requests))

    # -- retry policy -----------------------------------------------------------------

    def _admin_retry(
        self, err: grpc.RpcError, attempt: int, deadline: Deadline, idempotent: bool
    ) -> float | None:
        """Seconds to sleep before retrying, or None: a call that may have run is retried
        only when it is idempotent."""
        code, _ = rpc_status(err)
        if not idempotent and code is not grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        return self._retry_delay(err, attempt, deadline)


class AdminClient(AdminClientBase):
    """Blocking client of ``hopserve.v1.AdminService``; thread-safe.

    Constructor arguments: see :class:`AdminClientBase`.
    """

    def _init_channel(self) -> None:
        self._open_channel(grpc)

    # -- graphs -----------------------------------------------------------------------

    def update_graph(
        self,
        model: str,
        *,
        add_nodes: NodeRowsArg | None = None,
        add_edges: EdgesArg | None = None,
        remove_edges: EdgesArg | None = None,
        set_features: NodeRowsArg | None = None,
        idempotency_key: str | None = None,
        edge_weights: npt.ArrayLike | None = None,
        edge_features: npt.ArrayLike | None = None,
        edge_relations: Sequence[str] | None = None,
        remove_relations: Sequence[str] | None = None,
        set_node_type: str | None = None,
        add_node_type: str | None = None,
        timeout: float | None = None,
    ) -> GraphUpdateResult:
        """Apply one atomic batch of mutations to the graph ``model`` serves.

        Applied in the order add_nodes, remove_edges, add_edges, set_features; durable
        and visible to every later request once this returns.

        Args:
            model: A model served on the graph.
            add_nodes: ``(node_ids, features)``: new nodes, features ``[n, dim]`` float32
                (any float dtype is cast; the graph's feature width).
            add_edges: ``(src, dst)``: edges to add, by external node ID.
            remove_edges: ``(src, dst)``: edges to remove (every copy of each pair).
            set_features: ``(node_ids, features)``: new feature rows of existing nodes.
            idempotency_key: At most 128 printable characters; a retry with the same key
                answers the first outcome without applying the batch again (and makes
                the call safe to retry automatically).
            edge_weights: ``[len(src)]`` floats: the weight of each edge of ``add_edges``
                (sent as float32). Required when the graph holds edge weights, refused
                when it holds none.
            edge_features: ``[len(src), d_e]`` floats: the feature row of each edge of
                ``add_edges``; required (of the graph's width ``d_e``) when the graph holds
                edge features, refused when it holds none. Removed edges need no data.
            edge_relations: ``[len(src)]`` relation names: the relation of each edge of
                ``add_edges`` (``GraphInfo.relations``; ``"0"``, ``"1"``, ... on a graph
                built from ids). Required when the graph's edges are typed, refused when
                they are not. Removing ``src -> dst`` removes it under every relation.
            remove_relations: ``[len(src)]`` relation names of ``remove_edges`` (graphs
                with node types): each end is then an ID within its relation's node type
                (required where the types have their own IDs); the pair still goes under
                every relation.
            set_node_type: The node type ``set_features``' IDs are IDs within (graphs with
                node types; required where the types have their own IDs).
            add_node_type: The node type of ``add_nodes`` (required on a graph with node
                types, which takes new nodes where its types have their own IDs): each ID
                is new within the type, features the graph's width or the type's. Edges of
                the same batch name them by their relation's types like any other node.
            timeout: Deadline in seconds; None uses the client's.

        Raises:
            InvalidArgumentError: bad arguments (checked before sending), or a mutation
                the server refused (nothing applied). NotFoundError: unknown model.
            HopserveError: anything else (UNIMPLEMENTED: graph updates are off).
        """
        request = self._update_request(
            model, add_nodes, add_edges, remove_edges, set_features, idempotency_key,
            edge_weights, edge_features, edge_relations, remove_relations, set_node_type,
            add_node_type,
        )  # fmt: skip
        deadline = self._deadline(timeout)
        reply = self._admin_call("UpdateGraph", request, deadline, idempotency_key is not None)
        return self._update_result(reply)

    def compact_graph(self, model: str, *, timeout: float | None = None) -> GraphInfo:
        """Fold the update log of ``model``'s graph into a new base store (in the
        background of serving); answers the graph's state."""
        request = admin_pb2.CompactGraphRequest(model=check_model(model))
        deadline = self._deadline(timeout)
        return self._graph_info(self._admin_call("CompactGraph", request, deadline, False))

    def get_graph(self, model: str, *, timeout: float | None = None) -> GraphInfo:
        """The state of the graph ``model`` serves (sizes, versions, update log)."""
        request = admin_pb2.GetGraphRequest(model=check_model(model))
        deadline = self._deadline(timeout)
        return self._graph_info(self._admin_call("GetGraph", request, deadline, True))

    # -- models -----------------------------------------------------------------------

    def load_model(
        self,
        config: str | Mapping[str, Any],
        make_default: bool = False,
        *,
        timeout: float | None = None,
    ) -> ModelInfo:
        """Load a model version beside the served ones; it is served once its self-check
        passed.

        Args:
            config: One entry of a config file's ``models:`` list: YAML/JSON text or a
                mapping (name, version, entrypoint, kwargs, weights, graph, ...). Paths
                are resolved on the server (relative to its config file's folder); the
                graph must be one the server serves.
            make_default: Make it the default of its name once ready (the first version
                of a name always is).
            timeout: Deadline in seconds; None uses the client's (300 s by default).

        Raises:
            InvalidArgumentError: a bad entry, or one the worker cannot load.
            HopserveError: ``code`` ALREADY_EXISTS when the version is loaded,
                FAILED_PRECONDITION when its self-check failed.
        """
        request = self._load_request(config, make_default)
        deadline = self._deadline(timeout)
        return ModelInfo.from_proto(self._admin_call("LoadModel", request, deadline, False))

    def unload_model(
        self, name: str, version: str | int, *, timeout: float | None = None
    ) -> UnloadResult:
        """Unload a version once the requests in flight on it are answered.

        Raises:
            NotFoundError: unknown name or version. HopserveError: FAILED_PRECONDITION
                for the default version while other versions remain.
        """
        request = self._unload_request(name, version)
        deadline = self._deadline(timeout)
        return self._unload_result(self._admin_call("UnloadModel", request, deadline, False))

    def set_default_model(
        self,
        name: str,
        version: str | int,
        canary_version: str | int = "",
        canary_percent: int = 0,
        *,
        timeout: float | None = None,
    ) -> ModelInfo:
        """Make a ready version the default of its name, atomically; with a canary,
        ``canary_percent`` percent of the requests that name no version go to
        ``canary_version`` instead. Answers the default version's info.

        Raises:
            NotFoundError: unknown name or version. HopserveError: FAILED_PRECONDITION
                when a version is not ready.
        """
        request = self._default_request(name, version, canary_version, canary_percent)
        deadline = self._deadline(timeout)
        return ModelInfo.from_proto(self._admin_call("SetDefaultModel", request, deadline, True))

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; in-flight calls are cancelled. Idempotent."""
        self._closed = True
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _admin_call(self, method: str, request: Any, deadline: Deadline, idempotent: bool) -> Any:
        rpc = getattr(self._admin, method)
        attempt = 0
        while True:
            try:
                return rpc(request, timeout=deadline.rpc_timeout(), metadata=self._metadata)
            except grpc.RpcError as err:
                delay = self._admin_retry(err, attempt, deadline, idempotent)
                if delay is None:
                    raise from_rpc_error(err, method) from None
            time.sleep(delay)
            attempt += 1


class AsyncAdminClient(AdminClientBase):
    """Asyncio twin of :class:`AdminClient` (see it for each method); the channel is
    opened on first use and bound to that event loop."""

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

    async def update_graph(
        self,
        model: str,
        *,
        add_nodes: NodeRowsArg | None = None,
        add_edges: EdgesArg | None = None,
        remove_edges: EdgesArg | None = None,
        set_features: NodeRowsArg | None = None,
        idempotency_key: str | None = None,
        edge_weights: npt.ArrayLike | None = None,
        edge_features: npt.ArrayLike | None = None,
        edge_relations: Sequence[str] | None = None,
        remove_relations: Sequence[str] | None = None,
        set_node_type: str | None = None,
        add_node_type: str | None = None,
        timeout: float | None = None,
    ) -> GraphUpdateResult:
        """See :meth:`AdminClient.update_graph`."""
        request = self._update_request(
            model, add_nodes, add_edges, remove_edges, set_features, idempotency_key,
            edge_weights, edge_features, edge_relations, remove_relations, set_node_type,
            add_node_type,
        )  # fmt: skip
        deadline = self._deadline(timeout)
        reply = await self._admin_call(
            "UpdateGraph", request, deadline, idempotency_key is not None
        )
        return self._update_result(reply)

    async def compact_graph(self, model: str, *, timeout: float | None = None) -> GraphInfo:
        """See :meth:`AdminClient.compact_graph`."""
        request = admin_pb2.CompactGraphRequest(model=check_model(model))
        deadline = self._deadline(timeout)
        return self._graph_info(await self._admin_call("CompactGraph", request, deadline, False))

    async def get_graph(self, model: str, *, timeout: float | None = None) -> GraphInfo:
        """See :meth:`AdminClient.get_graph`."""
        request = admin_pb2.GetGraphRequest(model=check_model(model))
        deadline = self._deadline(timeout)
        return self._graph_info(await self._admin_call("GetGraph", request, deadline, True))

    async def load_model(
        self,
        config: str | Mapping[str, Any],
        make_default: bool = False,
        *,
        timeout: float | None = None,
    ) -> ModelInfo:
        """See :meth:`AdminClient.load_model`."""
        request = self._load_request(config, make_default)
        deadline = self._deadline(timeout)
        reply = await self._admin_call("LoadModel", request, deadline, False)
        return ModelInfo.from_proto(reply)

    async def unload_model(
        self, name: str, version: str | int, *, timeout: float | None = None
    ) -> UnloadResult:
        """See :meth:`AdminClient.unload_model`."""
        request = self._unload_request(name, version)
        deadline = self._deadline(timeout)
        return self._unload_result(await self._admin_call("UnloadModel", request, deadline, False))

    async def set_default_model(
        self,
        name: str,
        version: str | int,
        canary_version: str | int = "",
        canary_percent: int = 0,
        *,
        timeout: float | None = None,
    ) -> ModelInfo:
        """See :meth:`AdminClient.set_default_model`."""
        request = self._default_request(name, version, canary_version, canary_percent)
        deadline = self._deadline(timeout)
        reply = await self._admin_call("SetDefaultModel", request, deadline, True)
        return ModelInfo.from_proto(reply)

    async def close(self) -> None:
        """See :meth:`AdminClient.close`."""
        self._closed = True
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> AsyncAdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _admin_call(
        self, method: str, request: Any, deadline: Deadline, idempotent: bool
    ) -> Any:
        rpc = getattr(self._admin, method)
        attempt = 0
        while True:
            try:
                return await rpc(request, timeout=deadline.rpc_timeout(), metadata=self._metadata)
            except grpc.RpcError as err:
                delay = self._admin_retry(err, attempt, deadline, idempotent)
                if delay is None:
                    raise from_rpc_error(err, method) from None
            await asyncio.sleep(delay)
            attempt += 1


# ---------------------------------------------------------------------------- checks


def node_ids(what: str, ids: npt.ArrayLike) -> np.ndarray:
    """1-D int64 node IDs (may be empty) or :class:`InvalidArgumentError` naming ``what``."""
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: not array-like: {exc}") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what}: must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: must be integers, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > _INT64.max:
        raise InvalidArgumentError(f"{what}: node id {int(arr.max())} does not fit in int64")
    return arr.astype(np.int64, copy=False)


def node_rows(what: str, value: NodeRowsArg) -> pb.NodeRows:
    """``(node_ids, features)`` as a ``hopserve.v1.NodeRows`` (float32 packed bytes)."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidArgumentError(
            f"{what} must be a pair (node_ids, features), got {type(value).__name__}"
        )
    ids = node_ids(f"{what} node_ids", value[0])
    try:
        features = np.asarray(value[1])
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what} features: not array-like: {exc}") from None
    if features.ndim != 2:
        raise InvalidArgumentError(
            f"{what} features must be 2-D [n, dim], got shape {features.shape}"
        )
    if features.shape[0] != ids.size:
        raise InvalidArgumentError(
            f"{what}: {ids.size} node IDs but {features.shape[0]} feature rows"
        )
    if ids.size == 0:
        raise InvalidArgumentError(f"{what}: no nodes given")
    if features.shape[1] < 1:
        raise InvalidArgumentError(
            f"{what} features must have dim >= 1, got shape {features.shape}"
        )
    if features.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"{what} features must be numbers, got dtype {features.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        packed = np.ascontiguousarray(features, dtype=EMBEDDING_DTYPE)
    if not np.isfinite(packed).all():
        bad = int(np.flatnonzero(~np.isfinite(packed).all(axis=1))[0])
        raise InvalidArgumentError(
            f"{what}: features of node {int(ids[bad])} (row {bad}) are not finite in float32"
        )
    duplicates = _duplicates(ids)
    if duplicates:
        raise InvalidArgumentError(f"{what}: node IDs listed twice: {duplicates}")
    return pb.NodeRows(
        node_ids=ids.tolist(),
        features=packed.tobytes(),
        dim=int(features.shape[1]),
        dtype=pb.DTYPE_FLOAT32,
    )


def edge_list(
    what: str,
    value: EdgesArg,
    weights: npt.ArrayLike | None = None,
    features: npt.ArrayLike | None = None,
    relations: Sequence[str] | None = None,
) -> pb.EdgeList:
    """``(src, dst)`` as a ``hopserve.v1.EdgeList``, with the edges' ``weights`` ``[k]``
    and ``features`` ``[k, d_e]`` as float32 packed bytes and their ``relations`` (a name
    per edge) when given."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidArgumentError(f"{what} must be a pair (src, dst), got {type(value).__name__}")
    src, dst = node_ids(f"{what} src", value[0]), node_ids(f"{what} dst", value[1])
    if src.size != dst.size:
        raise InvalidArgumentError(f"{what}: {src.size} sources but {dst.size} destinations")
    if src.size == 0:
        raise InvalidArgumentError(f"{what}: no edges given")
    out = pb.EdgeList(src=src.tolist(), dst=dst.tolist())
    if weights is not None:
        packed = _edge_values(f"{what} edge_weights", weights, (src.size,))
        out.weights = packed.tobytes()
    if features is not None:
        packed = _edge_values(f"{what} edge_features", features, (src.size, None))
        out.features, out.feature_dim = packed.tobytes(), int(packed.shape[1])
    if weights is not None or features is not None:
        out.dtype = pb.DTYPE_FLOAT32
    if relations is not None:
        names = [relations] if isinstance(relations, str) else list(relations)
        if len(names) != src.size or not all(isinstance(n, str) and n for n in names):
            raise InvalidArgumentError(
                f"{what} edge_relations: expected {src.size} relation names (non-empty "
                f"strings, one per edge), got {names[:5]!r}{'...' if len(names) > 5 else ''}"
            )
        out.relations.extend(names)
    return out


def _edge_values(what: str, values: npt.ArrayLike, shape: tuple[int | None, ...]) -> np.ndarray:
    """``values`` as float32 of ``shape`` (``None``: any width >= 1), finite."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: not array-like: {exc}") from None
    want = [arr.shape[i] if n is None and i < arr.ndim else n for i, n in enumerate(shape)]
    if arr.shape != tuple(want) or (len(shape) == 2 and arr.shape[1] < 1):
        dims = ", ".join("d_e" if n is None else str(n) for n in shape)
        raise InvalidArgumentError(f"{what}: shape {arr.shape}, expected [{dims}] (one per edge)")
    if arr.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"{what} must be numbers, got dtype {arr.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        packed = np.ascontiguousarray(arr, dtype=EMBEDDING_DTYPE)
    bad = ~np.isfinite(packed.reshape(packed.shape[0], -1)).all(axis=1)
    if bad.any():
        raise InvalidArgumentError(
            f"{what}: edge {int(np.flatnonzero(bad)[0])} is not finite in float32"
        )
    return packed


def check_idempotency_key(key: str) -> str:
    """At most 128 printable characters, not empty."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"idempotency_key must be a non-empty string, got {key!r}")
    if len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise InvalidArgumentError(
            f"idempotency_key must be at most {MAX_IDEMPOTENCY_KEY} printable characters, "
            f"got {len(key)} characters{'' if key.isprintable() else ' (not printable)'}"
        )
    return key


def check_version_given(what: str, version: str | int) -> str:
    """A required model version (non-empty str or int) as its wire string."""
    if isinstance(version, bool) or not isinstance(version, str | int) or version == "":
        raise InvalidArgumentError(f"{what} must be a non-empty str or an int, got {version!r}")
    return str(version)


def model_entry(config: str | Mapping[str, Any]) -> str:
    """A ``models:`` entry as text: YAML/JSON as given, or a mapping as JSON."""
    if isinstance(config, str):
        if not config.strip():
            raise InvalidArgumentError("config is empty: give one models: entry")
        return config
    if not isinstance(config, Mapping):
        raise InvalidArgumentError(
            f"config must be YAML/JSON text or a mapping, got {type(config).__name__}"
        )
    for key in ("name", "entrypoint", "graph"):
        if key not in config:
            raise InvalidArgumentError(f"config has no {key!r} (a models: entry needs it)")
    try:
        return json.dumps(dict(config), default=_json_default)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"config cannot be sent as JSON: {exc}") from None


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} value {value!r} is not JSON")


def _duplicates(ids: np.ndarray) -> str:
    uniq, counts = np.unique(ids, return_counts=True)
    twice = uniq[counts > 1]
    if not twice.size:
        return ""
    shown = ", ".join(str(int(i)) for i in twice[:10])
    return shown + (f", ... ({twice.size - 10} more)" if twice.size > 10 else "")
