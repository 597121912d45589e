"""The ``hopserve.v1.EmbeddingService`` servicer: validate, cache, batch, plan, dispatch.

Pipeline of one embedding request (vLLM's front-end → engine split)::

    validate (model, ready, IDs count, fanouts, policy)      errors.py maps failures once
      └─ map external IDs → storage ids (unique IDs only)    UnknownNodeError → INVALID_ARGUMENT
           └─ cache lookup (policy USE, exact only)          misses continue
                └─ Batcher.submit(misses, BatchKey, deadline)   coalesces concurrent requests
                     └─ runner: Planner.plan(union) → Job → Dispatcher.run → stats → metrics
                └─ write-back (USE / REFRESH) as a background task, after answering
           └─ rows in request order (duplicates repeated) → response

Deadline: the client's gRPC deadline, else ``server.default_deadline_s``. A cancelled
RPC cancels its wait in the batcher (and the batch, if nobody else needs it).
Sampled requests (fanouts other than all ``-1``) are never cached, as the wire contract
promises (``QueryOptions.fanouts``); their seed defaults to 0 so they are reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc
import numpy as np

from hopserve.config import ServerConfig
from hopserve.logs import rate_limited
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.proto.v1 import embedding_pb2_grpc
from hopserve.rpc import UndecodableRequest
from hopserve.server.batcher import Batcher, BatchKey, BatchReply, BatchRun
from hopserve.server.cache import CacheNamespace, EmbeddingCache
from hopserve.server.dispatch import Dispatcher
from hopserve.server.errors import (
    InvalidRequestError,
    ShuttingDownError,
    format_ids,
    outcome_label,
    quote,
    to_status,
)
from hopserve.server.metrics import Metrics
from hopserve.server.models import ModelRegistry, ServedModel
from hopserve.server.planner import Planner
from hopserve.worker.graph.errors import UnknownNodeError
from hopserve.worker.job import Job, JobError
from hopserve.worker.runtime import errors as worker_errors

__all__ = ["MAX_CHUNK_BYTES", "EmbeddingFrontend", "StageTimes"]

logger = rate_limited(__name__)  # per-request warnings: one line per minute plus a count

MAX_CHUNK_BYTES = 2 * 1024 * 1024
"""Upper bound of the embedding bytes in one streamed chunk."""


_OFFLOAD_IDS = 20_000  # requests with more IDs are mapped on a thread
_UNKNOWN_MODEL = "_unknown"  # metric label for names that are not served (bounded cardinality)


@dataclass
class StageTimes:
    """Server seconds per stage of one request (``hopserve.v1.StageTiming``)."""

    cache_lookup: float = 0.0
    queue_wait: float = 0.0
    planning: float = 0.0
    compute: float = 0.0
    transfer: float = 0.0
    write_back: float = 0.0  # the write-back runs after answering: 0 in responses
    layer_compute: list[float] = field(default_factory=list)

    def add_reply(self, reply: BatchReply) -> None:
        """Add the batches a request rode in (their shared stages count in full)."""
        self.queue_wait += reply.queue_wait_s
        for run in reply.runs:
            self.planning += run.timing.get("planning", 0.0)
            self.compute += run.timing.get("compute", 0.0)
            self.transfer += run.timing.get("transfer", 0.0)
            if len(run.layer_compute) > len(self.layer_compute):
                self.layer_compute += [0.0] * (len(run.layer_compute) - len(self.layer_compute))
            for i, seconds in enumerate(run.layer_compute):
                self.layer_compute[i] += seconds

    def to_proto(self, total: float) -> pb.StageTiming:
        """As a ``StageTiming`` with ``total`` seconds."""
        return pb.StageTiming(
            cache_lookup=self.cache_lookup,
            queue_wait=self.queue_wait,
            planning=self.planning,
            compute=self.compute,
            transfer=self.transfer,
            write_back=self.write_back,
            total=total,
            layer_compute=self.layer_compute,
        )


@dataclass
class _Query:
    """A validated embedding request."""

    model: ServedModel
    ids: np.ndarray  # external IDs, request order
    uniq: np.ndarray  # the distinct external IDs, ascending
    inverse: np.ndarray  # ids == uniq[inverse]
    storage: np.ndarray  # storage id of each uniq
    key: BatchKey
    read_cache: bool
    write_cache: bool
    namespace: CacheNamespace
    deadline: float  # loop.time() instant


class _Pipeline:
    """Planner + batcher + dispatch of one model."""

    def __init__(
        self,
        model: ServedModel,
        dispatcher: Dispatcher,
        config: ServerConfig,
        metrics: Metrics,
        max_inflight: int,
    ) -> None:
        self.model = model
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.planner = Planner(
            model.name,
            model.graph,
            model.num_layers,
            metrics,
            input_layer=model.input_frontier,
        )
        self.batcher = Batcher(
            model.name,
            self.run_batch,
            max_batch_targets=config.max_batch_targets,
            max_wait_s=config.max_wait_ms / 1000.0,
            max_queue=config.max_queue,
            max_inflight=max_inflight,
            max_batch_requests=config.max_batch_requests,
            stall_after_s=config.stall_timeout_s,
            metrics=metrics,
        )
        self._job_ids = itertools.count()
        clients = dispatcher.clients
        self._worker_hint = clients[0].name if len(clients) == 1 else "unknown"

    async def run_batch(self, targets: np.ndarray, key: BatchKey, deadline: float) -> BatchRun:
        """The batcher's runner: plan the union once, run one job, record its stats."""
        model, metrics = self.model, self.metrics
        loop = asyncio.get_running_loop()
        plan = await asyncio.to_thread(self.planner.plan, targets, key)
        job = Job(
            job_id=f"{model.name}-{next(self._job_ids)}",
            model=model.name,
            model_version=model.version,
            targets=targets,
            frontiers=plan.frontiers,
            fanouts=key.fanouts,
            seed=key.seed,
            deadline=time.time() + max(0.0, deadline - loop.time()),
        )
        start = time.perf_counter()
        try:
            result = await self.dispatcher.run(job)
        except asyncio.CancelledError:
            metrics.worker_jobs.labels(self._worker_hint, "cancelled").inc()
            raise
        except JobError as exc:
            metrics.worker_jobs.labels(self._worker_hint, _job_outcome(exc)).inc()
            raise
        wall = time.perf_counter() - start
        metrics.worker_jobs.labels(result.worker or self._worker_hint, "ok").inc()
        rows = result.embeddings
        if rows.shape != (len(targets), model.dim):
            raise JobError(
                f"job {job.job_id}: worker {result.worker} answered rows of shape "
                f"{rows.shape}, expected {(len(targets), model.dim)}"
            )
        stats = result.stats
        # Exact jobs were planned here (the planner records "planning"); the worker only
        # checks the frontiers, which counts as preparing. Sampling jobs plan on the worker.
        worker_planning = 0.0 if key.exact else stats.planning_s
        timing = {
            "planning": plan.seconds + worker_planning,
            "prepare": stats.prepare_s + (stats.planning_s if key.exact else 0.0),
            "compute": stats.compute_s,
            # worker copies + layer write-outs + the dispatch round trip beyond the job
            "transfer": stats.transfer_s + stats.write_out_s + max(0.0, wall - stats.total_s),
        }
        for stage in ("prepare", "compute", "transfer"):
            metrics.observe_stage(model.name, stage, timing[stage])
        if not key.exact:
            metrics.observe_stage(model.name, "planning", worker_planning)
        for block, seconds in self._blocks(stats.layer_compute_s):
            metrics.layer_compute.labels(model.name, str(block)).observe(seconds)
        return BatchRun(
            rows=rows, timing=timing, layer_compute=self._per_layer(stats.layer_compute_s)
        )

    def _blocks(self, per_block: list[float]) -> Iterator[tuple[int, float]]:
        """(block index, seconds): blocks 0..L, or 1..L when block 0 is not reported."""
        first = 0 if len(per_block) == self.model.num_layers + 1 else 1
        return enumerate(per_block, start=first)

    def _per_layer(self, per_block: list[float]) -> tuple[float, ...]:
        """Seconds of layers 1..L (``StageTiming.layer_compute``); block 0 joins layer 1."""
        if len(per_block) == self.model.num_layers + 1 and per_block:
            return (per_block[0] + per_block[1], *per_block[2:])
        return tuple(per_block)


class EmbeddingFrontend(embedding_pb2_grpc.EmbeddingServiceServicer):
    """The public gRPC service of a front-end process.

    Args:
        config: Server settings (limits, batching, deadlines).
        models: The served models.
        cache: The embedding cache (never fails a request).
        dispatchers: Per model name, the dispatcher (``async run(job) -> JobResult``)
            reaching a worker that has the model.
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
        self._pipelines: dict[str, _Pipeline] = {}
        self._writebacks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._active = 0  # RPCs being answered (for the shutdown drain)
        self._idle = asyncio.Event()
        self._idle.set()
        self.max_chunk_bytes = MAX_CHUNK_BYTES  # embedding bytes per streamed chunk

    # ------------------------------------------------------------------ RPCs

    async def GetEmbeddings(  # noqa: N802 - gRPC method name
        self, request: pb.GetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEmbeddingsResponse:
        """Embeddings of ``request.node_ids`` in request order, in one message."""
        async with self._rpc("GetEmbeddings", request.model, context):
            start = time.perf_counter()
            query = await self._parse(request, context)
            times = StageTimes()
            rows, hits = await self._rows(query, 0, len(query.ids), times)
            model = query.model
            return pb.GetEmbeddingsResponse(
                dim=model.dim,
                dtype=pb.DTYPE_FLOAT32,
                embeddings=_pack(rows),
                num_nodes=len(query.ids),
                model=model.name,
                model_version=model.version,
                graph_version=model.graph_version,
                timing=times.to_proto(time.perf_counter() - start),
                cache_hits=int(hits.sum()),
            )

    async def StreamEmbeddings(  # noqa: N802 - gRPC method name
        self, request: pb.GetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbeddingChunk]:
        """The same rows as :meth:`GetEmbeddings`, as chunks of at most ~2 MiB.

        The request is computed in slices of about ``max_batch_targets`` rows (a whole
        number of chunks), one slice ahead of the one being sent, so rows stream as they
        complete.
        """
        async with self._rpc("StreamEmbeddings", request.model, context):
            start = time.perf_counter()
            query = await self._parse(request, context)
            model = query.model
            n = len(query.ids)
            chunk = max(1, self.max_chunk_bytes // (4 * model.dim))
            step = chunk * -(-self.config.max_batch_targets // chunk)  # whole chunks
            times = StageTimes()
            slices = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
            loop = asyncio.get_running_loop()
            ahead = loop.create_task(self._rows(query, *slices[0], times))
            try:
                for k, (lo, hi) in enumerate(slices):
                    rows, hits = await ahead
                    if k + 1 < len(slices):  # compute the next slice while this one is sent
                        ahead = loop.create_task(self._rows(query, *slices[k + 1], times))
                    for off in range(0, hi - lo, chunk):
                        end = min(off + chunk, hi - lo)
                        last = lo + end == n
                        yield pb.EmbeddingChunk(
                            offset=lo + off,
                            num_rows=end - off,
                            embeddings=_pack(rows[off:end]),
                            dim=model.dim,
                            dtype=pb.DTYPE_FLOAT32,
                            num_nodes=n,
                            model=model.name,
                            model_version=model.version,
                            graph_version=model.graph_version,
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
        """Every configured model, ready or not (``ready`` says which)."""
        async with self._rpc("ListModels", "", context):
            return pb.ListModelsResponse(models=[m.to_proto() for m in self.models])

    async def GetModel(  # noqa: N802 - gRPC method name
        self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        """One model's metadata; NOT_FOUND for an unknown name or version."""
        async with self._rpc("GetModel", request.name, context):
            return self.models.get(request.name, request.version).to_proto()

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
    ) -> AsyncIterator[None]:
        """Count the RPC, and answer any exception with its status (errors.py).

        The outcome is recorded before an error status is sent, so a client that saw the
        status also sees it counted.
        """
        label = model_name if model_name in self.models else _UNKNOWN_MODEL
        if method == "ListModels":
            label = ""
        gauge = self.metrics.inflight_requests.labels(label)
        gauge.inc()
        self._active += 1
        self._idle.clear()
        start = time.perf_counter()

        def record(code: grpc.StatusCode | None) -> None:
            gauge.dec()
            self._active -= 1
            if not self._active:
                self._idle.set()
            seconds = time.perf_counter() - start
            self.metrics.observe_request(method, label, outcome_label(code), seconds)

        try:
            yield
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
        self, request: pb.GetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> _Query:
        """Validate an embedding request and map its IDs (raises the errors of errors.py)."""
        if self._closing:
            raise ShuttingDownError("the server is shutting down; retry on another replica")
        model = self.models.get(request.model, request.model_version)
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
        key = self._batch_key(model, list(options.fanouts), options)
        policy = options.cache_policy
        if policy not in (
            pb.CACHE_POLICY_UNSPECIFIED,
            pb.CACHE_USE,
            pb.CACHE_REFRESH,
            pb.CACHE_BYPASS,
        ):
            raise InvalidRequestError(f"cache_policy {policy} is not a known CachePolicy")
        cacheable = key.exact
        namespace = CacheNamespace(
            model.name,
            model.version,
            model.graph_version,
            model.dim,
            variant=CacheNamespace.variant_for(key.fanouts, key.seed if key.fanouts else None),
        )
        ids = np.asarray(request.node_ids, dtype=np.int64)
        if n > _OFFLOAD_IDS:  # keep the event loop responsive for huge requests
            uniq, inverse, storage = await asyncio.to_thread(_map_ids, model, ids)
        else:
            uniq, inverse, storage = _map_ids(model, ids)
        remaining = context.time_remaining()
        if remaining is None:
            remaining = self.config.default_deadline_s
        return _Query(
            model=model,
            ids=ids,
            uniq=uniq,
            inverse=inverse,
            storage=storage,
            key=key,
            read_cache=cacheable and policy in (pb.CACHE_POLICY_UNSPECIFIED, pb.CACHE_USE),
            write_cache=cacheable and policy != pb.CACHE_BYPASS,
            namespace=namespace,
            deadline=asyncio.get_running_loop().time() + remaining,
        )

    @staticmethod
    def _batch_key(model: ServedModel, fanouts: list[int], options: pb.QueryOptions) -> BatchKey:
        if not fanouts:
            return BatchKey()
        if len(fanouts) != model.num_layers:
            raise InvalidRequestError(
                f"fanouts [{format_ids(fanouts)}] has {len(fanouts)} entries; model "
                f"{model.name!r} has {model.num_layers} layers (one fanout per layer, or none "
                "for exact)"
            )
        for i, f in enumerate(fanouts):
            if f != -1 and f < 1:
                raise InvalidRequestError(
                    f"fanouts[{i}] (layer {i + 1}) is {f}: use -1 (all neighbours) or a count >= 1"
                )
        if all(f == -1 for f in fanouts):
            return BatchKey()  # all neighbours at every layer: exact
        if not model.config.fanouts_allowed:
            raise InvalidRequestError(
                f"model {model.name!r} serves exact embeddings only; fanouts {fanouts} "
                "are not allowed"
            )
        seed = options.seed if options.HasField("seed") else 0
        return BatchKey(tuple(fanouts), int(seed))

    # ------------------------------------------------------------------ pipeline

    def _pipeline(self, model: ServedModel) -> _Pipeline:
        pipeline = self._pipelines.get(model.name)
        if pipeline is None:
            dispatcher = self._dispatchers[model.name]
            inflight = len(dispatcher.clients)
            pipeline = _Pipeline(model, dispatcher, self.config, self.metrics, inflight)
            self._pipelines[model.name] = pipeline
        return pipeline

    async def _rows(
        self, query: _Query, lo: int, hi: int, times: StageTimes
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``query.ids[lo:hi]`` (request order) and the per-row cache-hit mask."""
        model = query.model
        if lo == 0 and hi == len(query.ids):
            uniq, inverse, storage = query.uniq, query.inverse, query.storage
        else:
            uniq, inverse = np.unique(query.ids[lo:hi], return_inverse=True)
            storage = query.storage[np.searchsorted(query.uniq, uniq)]
        hit = np.zeros(len(uniq), dtype=bool)
        if query.read_cache:
            start = time.perf_counter()
            hit, rows = await self.cache.get_many(query.namespace, uniq)
            seconds = time.perf_counter() - start
            times.cache_lookup += seconds
            self.metrics.observe_stage(model.name, "cache_lookup", seconds)
            if not rows.flags.writeable:
                rows = rows.copy()
        else:
            rows = np.empty((len(uniq), model.dim), dtype=np.float32)
        miss = ~hit
        if miss.any():
            reply = await self._pipeline(model).batcher.submit(
                storage[miss], query.key, query.deadline
            )
            rows[miss] = reply.rows
            times.add_reply(reply)
            if query.write_cache:
                self._write_back(query.namespace, uniq[miss], reply.rows)
        return rows[inverse], hit[inverse]

    def _write_back(self, namespace: CacheNamespace, ids: np.ndarray, rows: np.ndarray) -> None:
        """Store computed rows in the background (never fails or delays the request)."""

        async def write() -> None:
            start = time.perf_counter()
            try:
                await self.cache.put_many(namespace, ids, rows)
            except Exception:  # the cache swallows backend errors; this is a bug
                logger.exception("cache write-back of %d rows failed", len(ids))
            self.metrics.observe_stage(namespace.model, "write_back", time.perf_counter() - start)

        task = asyncio.get_running_loop().create_task(write())
        self._writebacks.add(task)
        task.add_done_callback(self._writebacks.discard)

    # ------------------------------------------------------------------ lifecycle

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for pending cache write-backs (up to ``timeout`` seconds)."""
        tasks = list(self._writebacks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def stalled(self, model: str) -> bool:
        """Whether ``model``'s batcher has work and no batch finished for
        ``server.stall_timeout_s`` (see :meth:`Batcher.stalled`)."""
        pipeline = self._pipelines.get(model)
        if pipeline is None:
            return False
        return pipeline.batcher.stalled(asyncio.get_running_loop().time())

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
            await pipeline.batcher.close()


def _map_ids(model: ServedModel, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(uniq, inverse, storage)`` of external ``ids``; unknown IDs are INVALID_ARGUMENT,
    naming up to 10 of them in request order and how many rows they make up."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    try:
        storage = model.to_storage(uniq)
    except UnknownNodeError as err:
        bad = np.isin(ids, err.unknown)
        first = ids[bad]
        _, where = np.unique(first, return_index=True)
        raise InvalidRequestError(
            f"model {model.name!r}: {int(bad.sum())} of {len(ids)} requested node IDs are not "
            f"in the graph ({len(err.unknown)} distinct): "
            f"{format_ids(first[np.sort(where)], total=len(err.unknown))}"
        ) from None
    return uniq, inverse, storage


def _job_outcome(exc: JobError) -> str:
    """``hopserve_worker_jobs_total`` outcome of a failed job."""
    if isinstance(exc, worker_errors.DeadlineExceededError):
        return "timeout"
    return "oom" if "out of memory" in str(exc).lower() else "error"


def _consume(task: asyncio.Task[object]) -> None:
    """Retrieve a dropped task's outcome (no "exception was never retrieved" warning)."""
    if not task.cancelled():
        task.exception()


def _pack(rows: np.ndarray) -> bytes:
    """Little-endian float32 bytes, row-major."""
    return np.ascontiguousarray(rows, dtype="<f4").tobytes()
