"""The graph owner on a front-end: ``UpdateGraph``, ``CompactGraph`` and ``GetGraph``.

One :class:`GraphAdmin` per front-end handles the graph RPCs of
:class:`~hopserve.server.admin.AdminService` over the living graphs of its models
(:class:`~hopserve.worker.graph.live.LiveGraph`, one per graph folder, shared with the
in-process workers). An update, in order::

    decode      packed ids, float32 rows and edge data → MutationBatch   bad bytes: INVALID_ARGUMENT
    track       every ready model on the graph registers its kind (layers, degree norm)
    apply       resolve whole → log append + fsync → next snapshot → stale-since marks
    answer      graph_seq, counts, rows invalidated; metrics

Read-your-writes: the stale-since marks (``LiveGraph.stale_since``) are set before the
answer, and the edge drops every cached row computed at an earlier sequence than its
node's mark; jobs planned at the new sequence make workers catch up first. After
:data:`COMPACT_AFTER_BATCHES` logged batches a compaction starts in the background.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hopserve.proto.tensors import decode_embeddings
from hopserve.proto.v1 import admin_pb2
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.server.errors import InvalidRequestError, ModelNotReadyError, quote
from hopserve.server.metrics import Metrics
from hopserve.worker.graph.live import ApplyResult, InvalidUpdateError, LiveGraph, MutationBatch

__all__ = [
    "COMPACT_AFTER_BATCHES",
    "GraphAdmin",
    "decode_edges",
    "decode_rows",
    "model_kind",
    "row_width",
]

log = logging.getLogger(__name__)

COMPACT_AFTER_BATCHES = 10_000
"""Logged batches after which a graph is compacted automatically (0 = never)."""


def model_kind(model) -> tuple[int, bool, bool, bool]:  # noqa: ANN001 - a ServedModel
    """``(num_layers, degree_normalized, reads_source_degrees, reads_out_edges)`` of a
    ready model: what its invalidation set depends on."""
    status = model.status
    return (
        int(model.num_layers),
        bool(getattr(status, "degree_normalized", True)),
        bool(getattr(status, "reads_source_degrees", True)),
        bool(getattr(status, "reads_out_edges", False)),
    )


def decode_rows(rows: pb.NodeRows, dim: int, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(ids, float32 [k, dim] features)`` of a ``NodeRows`` message.

    Raises:
        InvalidRequestError: wrong dtype, width or byte count (names ``what``).
    """
    ids = np.asarray(rows.node_ids, dtype=np.int64)
    if ids.size == 0 and not rows.features:
        return ids, None
    if rows.dtype != pb.DTYPE_FLOAT32:
        raise InvalidRequestError(f"{what}: dtype must be DTYPE_FLOAT32")
    if rows.dim != dim:
        raise InvalidRequestError(
            f"{what}: feature width {rows.dim} does not match the graph's {dim}"
        )
    try:
        features = decode_embeddings(rows.features, int(ids.size), dim)
    except ValueError as err:
        raise InvalidRequestError(f"{what}: {err}") from None
    return ids, np.array(features, dtype=np.float32)


def row_width(live: LiveGraph, rows: pb.NodeRows) -> int:
    """The feature width ``rows`` may have: the graph's, or for new nodes of a narrower
    type the type's own (padded by the update's checks)."""
    dim = live.topology.feature_dim
    if rows.node_type and rows.dim != dim:
        try:
            width = live.topology.node_type(rows.node_type).feature_dim
        except KeyError:  # the update's checks name the unknown type
            return rows.dim
        return width if rows.dim == width else dim
    return dim


@dataclass(frozen=True)
class DecodedEdges:
    """An ``EdgeList`` in numpy: endpoints (external IDs) and the edge data given."""

    src: np.ndarray
    dst: np.ndarray
    weights: np.ndarray | None = None  # float32 [k]
    features: np.ndarray | None = None  # float32 [k, feature_dim]
    relations: list[str] | None = None  # a relation name per edge

    def mutation_fields(self) -> dict[str, object]:
        """The :class:`MutationBatch` fields of edges to add."""
        return {
            "add_src": self.src,
            "add_dst": self.dst,
            "add_edge_weight": self.weights,
            "add_edge_features": self.features,
            "add_edge_type": self.relations,
        }


def decode_edges(edges: pb.EdgeList, what: str, *, data: bool = True) -> DecodedEdges:
    """Endpoints, weights ``[k]``, features ``[k, feature_dim]`` and relation names of an
    ``EdgeList``; empty ``weights`` / ``features`` / ``relations`` mean none. Whether the
    graph needs or refuses them is :func:`~hopserve.worker.graph.live.mutations.resolve`'s
    to say.

    Args:
        data: Whether edge data may come with these edges (``False`` for edges to remove:
            weights and features there are refused, never ignored; relations name the
            node types of their ends).

    Raises:
        InvalidRequestError: edge data where none is taken, a wrong dtype, or a byte
            count that is not one value (weights) / row (features) per edge.
    """
    src = np.asarray(edges.src, dtype=np.int64)
    dst = np.asarray(edges.dst, dtype=np.int64)
    if not (edges.weights or edges.features or edges.relations):
        return DecodedEdges(src, dst)
    if not data and (edges.weights or edges.features):
        raise InvalidRequestError(
            f"{what}: edge data (weights / features) is only taken for added edges; "
            "removing src -> dst removes it under every relation, with its data"
        )
    relations = None
    if edges.relations:
        relations = list(edges.relations)
        if len(relations) != src.size:
            raise InvalidRequestError(
                f"{what}.relations: {len(relations)} names for {src.size} edges (one per edge)"
            )
    if not (edges.weights or edges.features):
        return DecodedEdges(src, dst, relations=relations)
    if edges.dtype != pb.DTYPE_FLOAT32:
        raise InvalidRequestError(f"{what}: dtype must be DTYPE_FLOAT32 with weights or features")
    k = int(src.size)
    weights = features = None
    if edges.weights:
        size = len(edges.weights)
        if size != 4 * k:
            raise InvalidRequestError(
                f"{what}.weights: {size} bytes for {k} edges (one float32 weight per edge: "
                f"{4 * k} bytes)"
            )
        weights = np.frombuffer(edges.weights, dtype="<f4").astype(np.float32)
    if edges.features:
        dim = int(edges.feature_dim)
        if dim < 1:
            raise InvalidRequestError(f"{what}.feature_dim must be >= 1 with features, got {dim}")
        try:
            features = np.array(decode_embeddings(edges.features, k, dim), dtype=np.float32)
        except ValueError as err:
            raise InvalidRequestError(
                f"{what}.features: not {k} rows of feature_dim {dim} ({err})"
            ) from None
    return DecodedEdges(src, dst, weights, features, relations)


class GraphAdmin:
    """The graph RPCs (the ``graphs`` handler of ``AdminService``).

    Args:
        models: The served models (their ``live`` graphs and kinds).
        metrics: Where update metrics go.
        compact_after: Logged batches that trigger a background compaction (0 = never).
    """

    def __init__(
        self, models, metrics: Metrics, compact_after: int = COMPACT_AFTER_BATCHES, edge=None
    ) -> None:  # noqa: ANN001
        self.models = models
        self.metrics = metrics
        self.edge = edge  # refreshes hot invalidated rows (EmbeddingService.refresh)
        for live in {id(m.live): m.live for m in models if getattr(m, "live", None)}.values():
            live.prepare_updates()
        self.compact_after = compact_after
        self._compactions: dict[Path, asyncio.Task[None]] = {}

    def _graph(self, name: str) -> LiveGraph:
        model = self.models.get(name)
        live = getattr(model, "live", None)
        if live is None:
            raise InvalidRequestError(f"model {quote(name)} serves a graph that takes no updates")
        return live

    def _on_graph(self, live: LiveGraph) -> list:
        return [m for m in self.models if getattr(m, "live", None) is live]

    def track_ready(self, live: LiveGraph) -> None:
        """Register the invalidation kind of every ready model on ``live``."""
        for model in self._on_graph(live):
            if model.ready:
                live.track(model_kind(model))

    async def update_graph(
        self, request: admin_pb2.UpdateGraphRequest, context: object
    ) -> admin_pb2.UpdateGraphResponse:
        """Apply one batch (see the module docstring)."""
        live = self._graph(request.model)
        dim = live.topology.feature_dim
        add_ids, add_rows = decode_rows(
            request.add_nodes, row_width(live, request.add_nodes), "add_nodes"
        )
        set_ids, set_rows = decode_rows(request.set_features, dim, "set_features")
        removed = decode_edges(request.remove_edges, "remove_edges", data=False)
        added = decode_edges(request.add_edges, "add_edges")
        batch = MutationBatch(
            add_node_ids=add_ids,
            add_node_features=add_rows,
            remove_src=removed.src,
            remove_dst=removed.dst,
            remove_edge_type=removed.relations,
            set_node_ids=set_ids,
            set_features=set_rows,
            set_node_type=request.set_features.node_type,
            add_node_type=request.add_nodes.node_type,
            idempotency_key=request.idempotency_key,
            **added.mutation_fields(),
        )
        self.track_ready(live)
        # A batch handed to its thread is applied whole even if the caller leaves: the
        # bookkeeping after it (metrics, compaction, hot-row refresh) then still runs, and
        # a retry with the same idempotency key is answered with the applied result.
        applying = asyncio.ensure_future(asyncio.to_thread(live.apply, batch))
        try:
            result = await asyncio.shield(applying)
        except asyncio.CancelledError:
            applying.add_done_callback(lambda done: self._after_cancelled_apply(live, done))
            raise
        except InvalidUpdateError as err:
            raise InvalidRequestError(f"model {quote(request.model)}: {err}") from None
        except OSError as err:  # the log could not be written: nothing was applied
            log.error("update log of %s: %s", live.path, err)
            raise ModelNotReadyError(f"the graph's update log cannot be written ({err})") from None
        self._after_apply(live, result)
        return admin_pb2.UpdateGraphResponse(
            graph_seq=result.seq,
            graph_version=live.lineage_version,
            nodes_added=result.nodes_added,
            edges_added=result.edges_added,
            edges_removed=result.edges_removed,
            features_set=result.features_set,
            rows_invalidated=result.rows_invalidated,
            replayed=result.replayed,
            num_nodes=result.num_nodes,
            num_edges=result.num_edges,
        )

    def _after_apply(self, live: LiveGraph, result: ApplyResult) -> None:
        """Metrics, auto-compaction and the refresh of hot invalidated rows."""
        label = live.path.name
        if not result.replayed:
            m = self.metrics
            m.graph_update_seconds.labels(label).observe(result.apply_s)
            m.graph_rows_invalidated.labels(label).observe(result.rows_invalidated)
            m.graph_mutations.labels(label).inc(
                result.nodes_added + result.edges_added + result.edges_removed
                + result.features_set
            )  # fmt: skip
        self._publish(live)
        self._maybe_compact(live)
        if self.edge is not None and result.affected:
            for model in self._on_graph(live):
                if model.ready and model_kind(model) in result.affected:
                    self.edge.refresh(model, result.affected[model_kind(model)])

    def _after_cancelled_apply(self, live: LiveGraph, done: asyncio.Future) -> None:
        """An update whose caller left: its bookkeeping, once the batch is applied."""
        if done.cancelled() or done.exception() is not None:
            return  # refused or not written: nothing was applied
        try:
            self._after_apply(live, done.result())
        except Exception:  # a callback must not raise into the loop
            log.exception("after an update whose caller left (%s)", live.path)

    async def compact_graph(
        self, request: admin_pb2.CompactGraphRequest, context: object
    ) -> admin_pb2.GraphInfo:
        """Compact now (waits for it); answers the graph's state afterwards."""
        live = self._graph(request.model)
        running = self._compactions.get(live.path)
        if running is not None and not running.done():
            await asyncio.shield(running)
        else:
            await self._compact(live)
        return self._info(live)

    async def get_graph(
        self, request: admin_pb2.GetGraphRequest, context: object
    ) -> admin_pb2.GraphInfo:
        """The graph's state."""
        return self._info(self._graph(request.model))

    # ------------------------------------------------------------------ internals
    def _info(self, live: LiveGraph) -> admin_pb2.GraphInfo:
        info = live.info()
        return admin_pb2.GraphInfo(**info, models=sorted({m.name for m in self._on_graph(live)}))

    def _publish(self, live: LiveGraph) -> None:
        label = live.path.name
        self.metrics.graph_seq.labels(label).set(live.seq)
        self.metrics.graph_log_batches.labels(label).set(len(live.log))

    def _maybe_compact(self, live: LiveGraph) -> None:
        if not self.compact_after or len(live.log) < self.compact_after:
            return
        running = self._compactions.get(live.path)
        if running is None or running.done():
            task = asyncio.get_running_loop().create_task(self._compact(live))
            self._compactions[live.path] = task

    async def _compact(self, live: LiveGraph) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await asyncio.to_thread(live.compact)
        except Exception:
            log.exception("compaction of %s failed (the log and the old base stay)", live.path)
            raise
        self.metrics.graph_compaction_seconds.labels(live.path.name).observe(loop.time() - start)
        self._publish(live)

    async def close(self) -> None:
        """Wait for a running compaction (it cannot be interrupted halfway safely)."""
        tasks = [t for t in self._compactions.values() if not t.done()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
