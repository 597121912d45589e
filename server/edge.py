"""The RPC edge: the ``hopserve.v1.EmbeddingService`` servicer (vLLM's API-server side).

One embedding request::

    parse      validate (model, ready, ID count, fanouts, policy)      errors.py maps failures
    map IDs    external → storage ids, deduplicated once (ascending)   unknown → INVALID_ARGUMENT
    cache      look the unique rows up (policy USE, exact only)        misses continue
    pipeline   ModelPipeline.batcher.submit(missing storage ids)       pipeline.py
    respond    every output row written once, from the cache or the batch, request order
    write-back the computed rows, in the background after answering (USE / REFRESH)

Deadline: the client's gRPC deadline, else ``server.default_deadline_s``. A cancelled
RPC cancels its wait in the batcher (and the batch, if nobody else needs it). Sampled
requests are never cached (``QueryOptions.fanouts``); their seed defaults to 0 so they
are reproducible. A stream is computed in slices, one ahead of the one being sent.

One module (about 460 lines): the four RPCs share parsing, ID mapping, the cache lookup
and the answer assembly; batching and the pipeline behind it live elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import numpy as np

from hopserve.config import ServerConfig
from hopserve.logs import rate_limited
from hopserve.proto.contract import validate_fanouts
from hopserve.proto.tensors import encode_embeddings
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.proto.v1 import embedding_pb2_grpc
from hopserve.rpc import UndecodableRequest
from hopserve.server.batcher import BatchKey
from hopserve.server.cache import CacheNamespace, EmbeddingCache
from hopserve.server.dispatch import Dispatcher
from hopserve.server.errors import (
    InvalidRequestError,
    ShuttingDownError,
    format_bad_ids,
    format_ids,
    outcome_label,
    quote,
    to_status,
)
from hopserve.server.graphs import decode_edges, model_kind, row_width
from hopserve.server.graphs import decode_rows as decode_node_rows
from hopserve.server.metrics import Metrics
from hopserve.server.models import ModelRegistry, ServedModel
from hopserve.server.pipeline import ModelPipeline
from hopserve.server.timing import StageTimes
from hopserve.worker.graph.errors import UnknownNodeError
from hopserve.worker.graph.live import InvalidUpdateError, MutationBatch
from hopserve.worker.graph.live.mutations import encode as encode_mutations
from hopserve.worker.graph.live.mutations import resolve as resolve_mutations
from hopserve.worker.graph.live.snapshot import apply_batch
from hopserve.worker.graph.node_types import type_of
from hopserve.worker.graph.planner import field_balls

__all__ = ["MAX_CHUNK_BYTES", "EmbeddingService"]

logger = rate_limited(__name__)

MAX_CHUNK_BYTES = 2 * 1024 * 1024
"""Upper bound of the embedding bytes in one streamed chunk."""

MAX_PENDING_WRITE_ROWS = 200_000
"""Computed rows waiting for the cache write-behind; beyond, new write-backs are dropped."""
_OFFLOAD_IDS = 20_000  # requests with more IDs are mapped on a thread
_UNKNOWN_MODEL = "_unknown"  # metric label for names that are not served (bounded cardinality)
_POLICIES = (pb.CACHE_POLICY_UNSPECIFIED, pb.CACHE_USE, pb.CACHE_REFRESH, pb.CACHE_BYPASS)


@dataclass
class _Query:
    """A validated embedding request."""

    model: ServedModel
    ids: np.ndarray  # external IDs, request order
    storage: np.ndarray  # storage id of each requested ID (request order)
    key: BatchKey
    read_cache: bool
    write_cache: bool
    namespace: CacheNamespace
    deadline: float  # loop.time() instant
    graph_seq: int = 0  # the graph sequence the answer's rows are exact for
    delta: DeltaResolver | None = None  # a cold-start request's own nodes and edges
    footprint: bool = False  # answer each target's computation footprint


class EmbeddingService(embedding_pb2_grpc.EmbeddingServiceServicer):
    """The public gRPC service of a front-end process.

    Args:
        config: Server settings (limits, batching, deadlines).
        models: The served models.
        cache: The embedding cache (never fails a request).
        dispatchers: Per model name, the dispatcher reaching a worker that has the model
            (for versions whose ``ServedModel.dispatcher`` is not set).
        metrics: Where to record request, stage and batch metrics.
    """

    def __init__(
        self,
        config: ServerConfig,
        models: ModelRegistry,
        cache: EmbeddingCache,
        dispatchers: dict[str, Dispatcher],
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.models = models
        self.cache = cache
        self.metrics = metrics
        self._dispatchers = dispatchers
        self._pipelines: dict[tuple[str, str], ModelPipeline] = {}  # by (name, version)
        self._writebacks: set[asyncio.Task[None]] = set()
        self._pending_writes: dict[tuple[CacheNamespace, int], list] = {}  # (ids, rows) parts
        self._pending_rows = 0
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._active = 0  # RPCs being answered (for the shutdown drain)
        self._idle = asyncio.Event()
        self._idle.set()
        self.max_chunk_bytes = MAX_CHUNK_BYTES  # embedding bytes per streamed chunk
        self.invalidation = "exact"  # cache.invalidation: "exact" or "flush"
        self.refresh_hot_rows = 0  # cache.refresh_hot_rows
        self._hot: dict[tuple[str, str], HotRows] = {}
        self._refreshing: dict[tuple[str, str], asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ RPCs

    async def GetEmbeddings(  # noqa: N802 - gRPC method name
        self, request: pb.GetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEmbeddingsResponse:
        """Embeddings of ``request.node_ids`` in request order, in one message."""
        async with self._rpc("GetEmbeddings", request.model, context) as call:
            start = time.perf_counter()
            query = await self._parse(request, context, call)
            times = StageTimes()
            rows, hits = await self._rows(query, slice(None), times)
            model = query.model
            return pb.GetEmbeddingsResponse(
                dim=model.dim,
                dtype=pb.DTYPE_FLOAT32,
                embeddings=encode_embeddings(rows),
                num_nodes=len(query.ids),
                model=model.name,
                model_version=model.version,
                graph_version=model.graph_version,
                timing=times.to_proto(time.perf_counter() - start),
                cache_hits=hits,
                graph_seq=query.graph_seq,
                footprints=await self._footprints(query) if query.footprint else (),
            )

    async def StreamEmbeddings(  # noqa: N802 - gRPC method name
        self, request: pb.GetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbeddingChunk]:
        """The same rows as :meth:`GetEmbeddings`, as chunks of at most ~2 MiB.

        The request is computed in slices of about ``max_batch_targets`` rows (a whole
        number of chunks), one slice ahead of the one being sent, so rows stream as they
        complete.
        """
        async with self._rpc("StreamEmbeddings", request.model, context) as call:
            start = time.perf_counter()
            query = await self._parse(request, context, call)
            model = query.model
            n = len(query.ids)
            chunk = max(1, self.max_chunk_bytes // (4 * model.dim))
            step = chunk * -(-self.config.max_batch_targets // chunk)  # whole chunks
            times = StageTimes()
            slices = [slice(lo, min(lo + step, n)) for lo in range(0, n, step)]
            loop = asyncio.get_running_loop()
            ahead = loop.create_task(self._rows(query, slices[0], times, per_row_hits=True))
            try:
                for k, piece in enumerate(slices):
                    rows, hits = await ahead
                    if k + 1 < len(slices):  # compute the next slice while this one is sent
                        nxt = slices[k + 1]
                        ahead = loop.create_task(self._rows(query, nxt, times, per_row_hits=True))
                    for off in range(0, piece.stop - piece.start, chunk):
                        end = min(off + chunk, piece.stop - piece.start)
                        last = piece.start + end == n
                        yield pb.EmbeddingChunk(
                            offset=piece.start + off,
                            num_rows=end - off,
                            embeddings=encode_embeddings(rows[off:end]),
                            dim=model.dim,
                            dtype=pb.DTYPE_FLOAT32,
                            num_nodes=n,
                            model=model.name,
                            model_version=model.version,
                            graph_version=model.graph_version,
                            graph_seq=query.graph_seq,
                            cache_hits=int(hits[off:end].sum()),
                            timing=times.to_proto(time.perf_counter() - start) if last else None,
                        )
            finally:
                if not ahead.done():  # the client went away: drop the next slice
                    ahead.cancel()
                    ahead.add_done_callback(_consume)

    async def ListModels(  # noqa: N802 - gRPC method name
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        """Every version of every model, in any state (``state`` says which)."""
        async with self._rpc("ListModels", "", context):
            return pb.ListModelsResponse(models=[self.models.info(m) for m in self.models])

    async def GetModel(  # noqa: N802 - gRPC method name
        self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        """One version's metadata (empty version: the default); NOT_FOUND for an unknown
        name or version."""
        async with self._rpc("GetModel", request.name, context):
            return self.models.info(self.models.get(request.name, request.version))

    # ------------------------------------------------------------------ edge

    def reject_undecodable(self, method: str, request: UndecodableRequest) -> None:
        """Count a request whose bytes did not decode; the service's handlers
        (:func:`hopserve.rpc.add_service`) answer it INVALID_ARGUMENT."""
        label = "" if method == "ListModels" else _UNKNOWN_MODEL
        outcome = outcome_label(grpc.StatusCode.INVALID_ARGUMENT)
        self.metrics.observe_request(method, label, outcome, 0.0)

    @contextlib.asynccontextmanager
    async def _rpc(
        self, method: str, model_name: str, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[_Call]:
        """Count the RPC, and answer any exception with its status (errors.py).

        The outcome is recorded before an error status is sent, so a client that saw the
        status also sees it counted; the model version the call was resolved to (if any)
        counts it in flight until then (what an unload drains).
        """
        label = model_name if model_name in self.models else _UNKNOWN_MODEL
        if method == "ListModels":
            label = ""
        gauge = self.metrics.inflight_requests.labels(label)
        gauge.inc()
        self._active += 1
        self._idle.clear()
        start = time.perf_counter()
        call = _Call()

        def record(code: grpc.StatusCode | None) -> None:
            call.release()
            gauge.dec()
            self._active -= 1
            if not self._active:
                self._idle.set()
            seconds = time.perf_counter() - start
            self.metrics.observe_request(method, label, outcome_label(code), seconds)

        try:
            yield call
        except (asyncio.CancelledError, GeneratorExit):
            left = context.time_remaining()
            expired = left is not None and left <= 0
            record(grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED)
            raise
        except Exception as exc:
            code, message = to_status(exc, where=f"{method} {quote(model_name)}")
            record(code)
            await context.abort(code, message)
        else:
            record(None)

    async def _parse(
        self, request: pb.GetEmbeddingsRequest, context: grpc.aio.ServicerContext, call: _Call
    ) -> _Query:
        """Validate an embedding request, resolve its model version (default or canary
        when it names none) and map its IDs (raises the errors of errors.py)."""
        if self._closing:
            raise ShuttingDownError("the server is shutting down; retry on another replica")
        model = self.models.route(request.model, request.model_version)
        call.hold(model)  # before any await: an unload that starts now waits for it
        model.require_ready()
        n = len(request.node_ids)
        if n == 0:
            raise InvalidRequestError("node_ids is empty: ask for at least one node")
        limit = min(self.config.max_request_nodes, model.config.max_targets)
        if n > limit:
            raise InvalidRequestError(
                f"request has {n} node IDs; model {model.name!r} accepts at most {limit} per "
                "request: split it (the client SDK does, see max_nodes_per_request)"
            )
        options = request.options
        key = _batch_key(model, options)
        policy = options.cache_policy
        if policy not in _POLICIES:
            raise InvalidRequestError(f"cache_policy {policy} is not a known CachePolicy")
        namespace = CacheNamespace(
            model.name,
            model.version,
            model.cache_graph_version,
            model.dim,
            variant=CacheNamespace.variant_for(key.fanouts, key.seed if key.fanouts else None),
        )
        ids = np.asarray(request.node_ids, dtype=np.int64)
        delta = _delta_of(model, request, key)
        node_type = request.node_type
        if node_type and delta is None:  # from here on store-wide IDs: the cache key
            ids = _store_wide_ids(model, ids, node_type)
        elif model.output_types and delta is None:
            _check_output_types(model, ids)
        if delta is not None:  # cold start: IDs are mapped on graph + delta, no cache
            storage = (await asyncio.to_thread(delta, model.topology))[2]
            policy = pb.CACHE_BYPASS
        elif n > _OFFLOAD_IDS:  # keep the event loop responsive for huge requests
            storage = await asyncio.to_thread(_to_storage, model, ids)
        else:
            storage = _to_storage(model, ids)
        self.metrics.requested_rows.labels(model.name, node_type or "any").inc(n)
        remaining = context.time_remaining()
        if remaining is None:
            remaining = self.config.default_deadline_s
        return _Query(
            model=model,
            ids=ids,
            storage=storage,
            key=key,
            read_cache=key.exact and policy in (pb.CACHE_POLICY_UNSPECIFIED, pb.CACHE_USE),
            write_cache=key.exact and policy != pb.CACHE_BYPASS,
            namespace=namespace,
            deadline=asyncio.get_running_loop().time() + remaining,
            graph_seq=model.graph_seq,
            delta=delta,
            footprint=request.footprint,
        )

    # ------------------------------------------------------------------ rows

    def pipeline(self, model: ServedModel) -> ModelPipeline:
        """The model version's pipeline (built on first use, once the version is ready)."""
        pipeline = self._pipelines.get(model.key)
        if pipeline is None:
            dispatcher = model.dispatcher or self._dispatchers[model.name]
            pipeline = ModelPipeline(model, dispatcher, self.config, self.metrics)
            self._pipelines[model.key] = pipeline
        return pipeline

    async def retire(self, model: ServedModel) -> None:
        """Close and forget a model version's pipeline (after it drained: an unload)."""
        pipeline = self._pipelines.pop(model.key, None)
        if pipeline is not None:
            await pipeline.close()

    async def _rows(
        self, query: _Query, piece: slice, times: StageTimes, *, per_row_hits: bool = False
    ) -> tuple[np.ndarray, int | np.ndarray]:
        """Rows of ``query.ids[piece]`` in request order, and how many came from the cache
        (per row with ``per_row_hits``).

        The piece's targets are deduplicated once (unique ascending storage ids); the cache
        is asked for those, the batcher for the ones it misses, and every output row is
        written once, from one or the other.
        """
        model = query.model
        if query.delta is not None:  # its own graph: one job, never cached or coalesced
            rows, seq = await self.pipeline(model).run_delta(
                query.delta.bind(query.ids[piece]), query.deadline
            )
            query.graph_seq = seq
            return rows, (np.zeros(len(rows), bool) if per_row_hits else 0)
        uniq, first, inverse = np.unique(
            query.storage[piece], return_index=True, return_inverse=True
        )
        hit = np.zeros(len(uniq), dtype=bool)
        cached = None
        live = model.live
        if query.read_cache:
            start = time.perf_counter()
            external = query.ids[piece][first]  # the cache is keyed by external ID
            min_seq = max_seq = None
            if live is not None:  # rows older than their node's last change are misses
                kind = model_kind(model)
                live.track(kind)
                max_seq = live.seq
                if self.invalidation == "flush":  # the baseline: any update flushes all
                    min_seq = np.full(uniq.shape, live.seq, dtype=np.int64)
                else:
                    min_seq = live.stale_since(kind, uniq)
                self._hot_rows(model).note(uniq)
            hit, cached = await self.cache.get_many(query.namespace, external, min_seq, max_seq)
            seconds = time.perf_counter() - start
            times.cache_lookup += seconds
            self.metrics.observe_stage(model.name, "cache_lookup", seconds)
        rows = np.empty((len(inverse), model.dim), dtype=np.float32)
        row_hit = hit[inverse]
        if cached is not None and row_hit.any():
            rows[row_hit] = cached[inverse[row_hit]]
        if not hit.all():
            miss = ~hit
            reply = await self.pipeline(model).batcher.submit(uniq[miss], query.key, query.deadline)
            for run in reply.runs:
                times.add(run.timing)
            times.queue_wait += reply.queue_wait_s
            rank = np.cumsum(miss) - 1  # position of each unique row among the misses
            rows[~row_hit] = reply.rows[rank[inverse[~row_hit]]]
            query.graph_seq = max(query.graph_seq, reply.graph_seq)
            if query.write_cache:
                self._write_back(
                    query.namespace, query.ids[piece][first][miss], reply.rows, reply.graph_seq
                )
        return rows, (row_hit if per_row_hits else int(row_hit.sum()))

    def _write_back(
        self, namespace: CacheNamespace, ids: np.ndarray, rows: np.ndarray, seq: int = 0
    ) -> None:
        """Store computed rows in the background (never fails or delays the request),
        tagged with the graph sequence they were computed at.

        Write-behind with group commit: rows queued while a write is in flight go out
        together in the next one (one round trip per batch of requests, not one per
        request). Past :data:`MAX_PENDING_WRITE_ROWS` queued rows, new ones are dropped
        (a later miss recomputes them).
        """
        if self._pending_rows + len(ids) > MAX_PENDING_WRITE_ROWS:
            logger.debug("cache write-back queue full: %d rows dropped", len(ids))
            self.metrics.cache_writeback_dropped.labels(namespace.model).inc(len(ids))
            return
        self._pending_writes.setdefault((namespace, seq), []).append((ids, rows))
        self._pending_rows += len(ids)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_pending())
            self._writebacks.add(self._writer)
            self._writer.add_done_callback(self._writebacks.discard)

    async def _write_pending(self) -> None:
        """Write the queued rows, one ``put_many`` per namespace and sequence, until none
        are left."""
        while self._pending_writes:
            pending, self._pending_writes = self._pending_writes, {}
            self._pending_rows = 0
            for (namespace, seq), parts in pending.items():
                ids = np.concatenate([p[0] for p in parts])
                rows = np.concatenate([p[1] for p in parts])
                start = time.perf_counter()
                try:
                    await self.cache.put_many(namespace, ids, rows, seq)
                except Exception:  # the cache swallows backend errors; this is a bug
                    logger.exception("cache write-back of %d rows failed", len(ids))
                seconds = time.perf_counter() - start
                self.metrics.observe_stage(namespace.model, "write_back", seconds)

    async def _footprints(self, query: _Query) -> list[pb.TargetFootprint]:
        """Per requested node: its frontier sizes alone, and the largest in-degree its
        layers aggregate over (``hub`` at ``server.hub_degree`` or more)."""
        model = query.model
        topology = model.topology
        if query.delta is not None:
            topology = (await asyncio.to_thread(query.delta.bind(query.ids), topology))[1]
        hub = self.config.hub_degree
        both_ways = bool(getattr(model.status, "reads_out_edges", False))
        prints = await asyncio.to_thread(
            footprints, topology, query.storage, model.num_layers, both_ways
        )
        return [
            pb.TargetFootprint(frontier_sizes=sizes, max_degree=degree, hub=degree >= hub)
            for sizes, degree in prints
        ]

    # ------------------------------------------------------------------ refresh

    def _hot_rows(self, model: ServedModel) -> HotRows:
        hot = self._hot.get((model.name, model.version))
        if hot is None:
            hot = self._hot[(model.name, model.version)] = HotRows(4 * self.refresh_hot_rows)
        return hot

    def refresh(self, model: ServedModel, affected: np.ndarray) -> int:
        """Recompute, in the background, the recently requested rows among ``affected``
        (storage ids an update invalidated) and write them back, so their next lookup is
        a hit again (exact: computed at the new sequence). Requests come first: nothing is
        refreshed while the model has batches queued or running, or a refresh of its own
        still runs. Returns how many rows."""
        if not self.refresh_hot_rows or self._closing or not model.ready:
            return 0
        key = (model.name, model.version)
        running = self._refreshing.get(key)
        batcher = self.pipeline(model).batcher
        if (running is not None and not running.done()) or batcher.depth or batcher.running:
            return 0  # requests first: one refresh at a time, only while the model is idle
        ids = self._hot_rows(model).among(affected)[: self.refresh_hot_rows]
        if ids.size == 0:
            return 0
        namespace = CacheNamespace(model.name, model.version, model.cache_graph_version, model.dim)

        async def run() -> None:
            loop = asyncio.get_running_loop()
            try:
                pipeline = self.pipeline(model)
                deadline = loop.time() + self.config.default_deadline_s
                reply = await pipeline.batcher.submit(ids, BatchKey(), deadline)
                external = model.topology.to_external(ids)
                await self.cache.put_many(namespace, external, reply.rows, reply.graph_seq)
            except Exception as err:  # best effort: a miss later recomputes the row
                logger.debug("refresh of %d rows of %r failed: %s", ids.size, model.name, err)

        task = asyncio.get_running_loop().create_task(run())
        self._writebacks.add(task)
        task.add_done_callback(self._writebacks.discard)
        self._refreshing[key] = task
        return int(ids.size)

    # ------------------------------------------------------------------ lifecycle

    def stalled(self, model: str) -> bool:
        """Whether a batcher of a version of ``model`` has work and no batch finished for
        ``server.stall_timeout_s`` (see :meth:`Batcher.stalled`)."""
        now = asyncio.get_running_loop().time()
        return any(
            p.batcher.stalled(now) for (name, _), p in self._pipelines.items() if name == model
        )

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for pending cache write-backs (up to ``timeout`` seconds)."""
        tasks = list(self._writebacks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def stop_accepting(self) -> None:
        """Answer new embedding requests with UNAVAILABLE from now on."""
        self._closing = True

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no RPC is being answered (up to ``timeout``); True if idle.

        After :meth:`stop_accepting` new embedding requests are answered at once, so this
        returns when the requests that were already in flight have their answers.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self._idle.is_set()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, finish write-backs, fail what is still queued."""
        self.stop_accepting()
        await self.drain(timeout)
        for pipeline in self._pipelines.values():
            await pipeline.close()


class _Call:
    """The model version one RPC was resolved to, counted in flight while it is answered."""

    def __init__(self) -> None:
        self.model: ServedModel | None = None

    def hold(self, model: ServedModel) -> None:
        self.release()
        self.model = model
        model.enter()

    def release(self) -> None:
        if self.model is not None:
            self.model.leave()
            self.model = None


def _batch_key(model: ServedModel, options: pb.QueryOptions) -> BatchKey:
    """What a request's batch must share: exact, or (fanouts, seed)."""
    try:
        fanouts = validate_fanouts(list(options.fanouts), model.num_layers)
    except ValueError as err:
        raise InvalidRequestError(f"model {model.name!r}: {err}") from None
    if fanouts is None:
        return BatchKey()  # no fanouts, or all neighbours at every layer: exact
    if not model.config.fanouts_allowed:
        raise InvalidRequestError(
            f"model {model.name!r} serves exact embeddings only; fanouts "
            f"[{format_ids(fanouts)}] are not allowed"
        )
    return BatchKey(fanouts, int(options.seed) if options.HasField("seed") else 0)


def _store_wide_ids(
    model: ServedModel,
    ids: np.ndarray,
    node_type: str,
    topology=None,  # noqa: ANN001
) -> np.ndarray:
    """``node_type``'s IDs (its own, or ``0..count-1``) -> store-wide IDs, which key the
    cache and the invalidation (on ``topology``: the model's graph, or graph + a request's
    delta); a type the graph lacks or IDs the type does not have are INVALID_ARGUMENT
    naming them."""
    topology = model.topology if topology is None else topology
    types = {t.name: t for t in topology.meta.node_types or ()}
    t = types.get(node_type)
    if t is None:
        have = f"its node types: {', '.join(types)}" if types else "its nodes are untyped"
        raise InvalidRequestError(
            f"model {model.name!r}: the graph has no node type {quote(node_type)} ({have})"
        )
    if model.output_types and node_type not in model.output_types:
        raise InvalidRequestError(
            f"model {model.name!r} outputs embeddings of node types "
            f"{', '.join(model.output_types)} only, not {quote(node_type)}"
        )
    store_wide, found = topology.find_typed(ids, node_type)
    if not found.all():
        known = (
            f"its {t.total} IDs are its own"
            if topology.type_node_ids is not None
            else f"its {t.count} IDs are 0..{t.count - 1}"
        )
        raise InvalidRequestError(
            f"model {model.name!r}: {int((~found).sum())} of {len(ids)} requested "
            f"{quote(node_type)} node IDs are not in the graph ({known}): "
            f"{format_bad_ids(ids, ~found)}"
        )
    return store_wide


def _check_output_types(model: ServedModel, ids: np.ndarray) -> None:
    """Store-wide IDs of a model that outputs some node types only must be of those types
    (INVALID_ARGUMENT naming the first others); IDs outside the graph are left to
    :func:`_to_storage`."""
    types = list(model.topology.meta.node_types or ())
    if not types:
        return
    inside = (ids >= 0) & (ids < model.topology.num_nodes)
    kind = type_of(types, np.where(inside, ids, 0))
    ok = np.array([t.name in model.output_types for t in types])
    bad = inside & ~ok[kind]
    if bad.any():
        raise InvalidRequestError(
            f"model {model.name!r} outputs embeddings of node types "
            f"{', '.join(model.output_types)} only; {int(bad.sum())} of {len(ids)} requested "
            f"node IDs are of other types: {format_bad_ids(ids, bad)}"
        )


def _to_storage(model: ServedModel, ids: np.ndarray) -> np.ndarray:
    """Storage id of each external ID; unknown IDs are INVALID_ARGUMENT, naming up to 10
    of them in request order and how many rows they make up."""
    try:
        return model.to_storage(ids)
    except UnknownNodeError as err:
        bad = np.isin(ids, err.unknown)
        raise InvalidRequestError(
            f"model {model.name!r}: {int(bad.sum())} of {len(ids)} requested node IDs are not "
            f"in the graph ({len(err.unknown)} distinct): {format_bad_ids(ids, bad)}"
        ) from None


class HotRows:
    """The storage ids requested most recently (a bounded LRU set)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[int, None] = OrderedDict()

    def note(self, ids: np.ndarray) -> None:
        """Mark ``ids`` requested now."""
        if not self.capacity:
            return
        for node in ids[-self.capacity :].tolist():
            self._ids[node] = None
            self._ids.move_to_end(node)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def among(self, nodes: np.ndarray) -> np.ndarray:
        """The hot ids within sorted ``nodes``, most recent first."""
        if not self._ids or nodes.size == 0:
            return np.empty(0, dtype=np.int64)
        hot = np.fromiter(reversed(self._ids), dtype=np.int64, count=len(self._ids))
        return hot[np.isin(hot, nodes, assume_unique=True)]


class DeltaResolver:
    """A cold-start request's delta, checked against whichever snapshot it is planned on.

    Calling it with a snapshot returns ``(encoded delta, snapshot + delta, storage ids of
    the bound targets)``; :class:`InvalidUpdateError` becomes INVALID_ARGUMENT naming the
    bad mutation, an unknown target ID names the ID.
    """

    def __init__(
        self,
        model: ServedModel,
        batch: MutationBatch,
        ids: np.ndarray,
        node_type: str = "",
        spliced: dict | None = None,
    ) -> None:
        self.model = model
        self.model_name = model.name
        self.batch = batch
        self.ids = ids
        self.node_type = node_type  # the targets are IDs within it (new ones included)
        # snapshot -> (encoded delta, snapshot + delta): one splice per snapshot, shared
        # by the ID mapping, the job and the footprints (and by every slice of a stream).
        self._spliced = {} if spliced is None else spliced

    def bind(self, ids: np.ndarray) -> DeltaResolver:
        """The same delta for other targets (a slice of a streamed request)."""
        return DeltaResolver(self.model, self.batch, ids, self.node_type, self._spliced)

    def __call__(self, topology) -> tuple[bytes, object, np.ndarray]:  # noqa: ANN001
        done = self._spliced.get(topology.seq)
        if done is None or done[0] is not topology:
            try:
                resolved = resolve_mutations(self.batch, topology, topology.seq)
            except InvalidUpdateError as err:
                raise InvalidRequestError(f"model {self.model_name!r}: delta: {err}") from None
            done = (topology, encode_mutations(resolved), apply_batch(topology, resolved))
            self._spliced.clear()  # older snapshots are not planned on again
            self._spliced[topology.seq] = done
        _, encoded, extended = done
        ids = self.ids
        if self.node_type:  # IDs within the type, on graph + delta
            ids = _store_wide_ids(self.model, ids, self.node_type, extended)
        try:
            storage = extended.to_storage(ids)
        except UnknownNodeError as err:
            raise InvalidRequestError(
                f"model {self.model_name!r}: {len(err.unknown)} requested node IDs are in "
                f"neither the graph nor the delta: {format_ids(err.unknown)}"
            ) from None
        return encoded, extended, storage


def _delta_of(model: ServedModel, request: pb.GetEmbeddingsRequest, key: BatchKey):  # noqa: ANN202
    """The request's :class:`DeltaResolver`, or ``None`` without a delta."""
    if not request.HasField("delta"):
        return None
    delta = request.delta
    edges = delta.add_edges
    if not (
        delta.add_nodes.node_ids
        or edges.src
        or edges.dst
        or edges.weights
        or edges.features
        or edges.relations
    ):
        return None
    if model.live is None:
        raise InvalidRequestError(f"model {model.name!r} serves a graph that takes no delta")
    if not key.exact:
        raise InvalidRequestError("a request with a delta is exact only: drop the fanouts")
    width = row_width(model.live, delta.add_nodes)
    ids, rows = decode_node_rows(delta.add_nodes, width, "delta.add_nodes")
    added = decode_edges(delta.add_edges, "delta.add_edges")
    batch = MutationBatch(
        add_node_ids=ids,
        add_node_features=rows,
        add_node_type=delta.add_nodes.node_type,
        **added.mutation_fields(),
    )
    return DeltaResolver(
        model, batch, np.asarray(request.node_ids, dtype=np.int64), request.node_type
    )


def footprints(
    topology,  # noqa: ANN001
    storage: np.ndarray,
    num_layers: int,
    both_ways: bool = False,
) -> list[tuple[list[int], int]]:
    """Per target: ``|V^0| … |V^L|`` planned for it alone (``both_ways``: over in- and
    out-edges, a node-wise field reading out-neighbours), and the largest in-degree (in-
    plus out-degree, both ways) among ``V^1 … V^L`` (the nodes whose aggregations it
    needs)."""
    degrees = topology.in_degrees + topology.out_degrees if both_ways else topology.in_degrees
    out = []
    for target in storage.tolist():
        balls = field_balls(topology, np.array([target]), num_layers, both_ways)
        sizes = [int(b.size) for b in reversed(balls)]
        nodes = balls[-2] if num_layers else None
        top = int(degrees[nodes].max()) if nodes is not None and nodes.size else 0
        out.append((sizes, top))
    return out


def _consume(task: asyncio.Task[object]) -> None:
    """Retrieve a dropped task's outcome (no "exception was never retrieved" warning)."""
    if not task.cancelled():
        task.exception()
